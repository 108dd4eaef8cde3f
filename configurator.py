"""
nanoGPT-style configuration: config files, then --key=value overrides.

    python train.py config/pystdlib.py --mixer=gdn --batch_size=8 --compile=False

Used from train.py / sample.py as

    from configurator import configure
    configure(globals(), sys.argv[1:])

Rules (nanoGPT's, made strict):
- a positional argument is a config file; it is exec'd with the script's globals, in order;
- `--key=value` must name an existing global; the value goes through `ast.literal_eval`
  and falls back to the raw string; only the first '=' splits, so `--start="a=b"` works;
- the type must match the default's: an int is accepted where a float is expected, a `None`
  default accepts anything, a str default keeps the raw text (`--out_dir=123` is the string '123');
- a key in `nullable` also accepts None (sample.py's `--top_k=None`);
- an unknown key or a wrong type is a UserError naming the key, the source and both types;
- later sources override earlier ones. A config file runs with the script's globals as the sources before it
  left them and the overrides after it will set them, so its rules can read the command line's choices
  (`head_dim = 128 if 'kda' in mixer else 64`); `__file__` is the file's own path. Only rank 0 prints (RANK unset or '0');
- `--help` (or `-h`) prints the script's docstring and its settings block (the globals between the first two
  `# ---` lines: defaults and their comments), then exits.

UserError is a mistake in the settings, the data, a checkpoint or the environment, not a bug. Every script calls
main_script(__name__) before its heavy imports: run as __main__, it installs `excepthook`, which prints a UserError as
one line (on rank 0 only under torchrun) and exits with status 1, and a Ctrl-C before the script handles it as one line
and 130; every other exception keeps its traceback.
"""
import os
import difflib
import math
import sys
import time
from ast import literal_eval


class UserError(ValueError):
    """A setting, a file or the environment is wrong: printed as one line that says what to do, no traceback."""


def excepthook(kind, value, tb):
    """sys.excepthook of the scripts: a UserError is one line on stderr (rank 0 only) and exit status 1; Ctrl-C
    before a script handles it itself (while it imports or loads) is one line and 130; anything else is a bug and
    prints its full traceback as usual."""
    if issubclass(kind, KeyboardInterrupt):
        print(f"{os.path.basename(sys.argv[0])}: interrupted (Ctrl-C); nothing was saved", file=sys.__stderr__, flush=True)
        os._exit(130)
    if not issubclass(kind, UserError):
        return sys.__excepthook__(kind, value, tb)
    rank = int(os.environ.get('RANK', '0'))
    if rank != 0:
        # under torchrun every rank usually meets the same error: rank 0 reports it, and torchrun stops this rank
        # when rank 0 exits. Still here after that wait, the error is this rank's own: report it, once.
        time.sleep(3)
    # sys.__stderr__: torch.distributed's own hook, which calls this one, swaps sys.stderr for a buffer
    print(f"{f'[rank{rank}] ' if rank else ''}{os.path.basename(sys.argv[0])}: error: {value}",
          file=sys.__stderr__ or sys.stderr, flush=True)
    if 'RANK' in os.environ:  # under torchrun: leave before the process group's teardown, which can abort noisily
        sys.stdout.flush()
        os._exit(1)


def main_script(name):
    """Every script's first call (name = its __name__), before torch loads: run as a program, a UserError and a
    Ctrl-C while it still imports are one line each (excepthook); imported as a module (by a test), nothing changes."""
    if name == '__main__':
        sys.excepthook = excepthook


def device_and_dtype(device, dtype):
    """Resolve device ('' = cuda if available, else cpu) and dtype ('' = bfloat16 on CUDA if supported, else float16
    there; float32 elsewhere), or raise a UserError naming what this machine lacks."""
    import torch  # here, not at the top: the configurator itself needs no torch
    device = device or ('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise UserError(f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but torch {torch.__version__} sees no CUDA GPU here: use --device=cpu "
                        f"(or leave device unset to pick the GPU when there is one)")
    if kind == 'cuda' and (torch.device(device).index or 0) >= torch.cuda.device_count():
        raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s): use cuda:0 ..")
    if kind == 'mps' and not torch.backends.mps.is_available():
        raise UserError(f"device={device!r} but MPS (Apple GPU) is not available here: use --device=cpu")
    if kind not in ('cpu', 'cuda', 'mps'):
        raise UserError(f"device={device!r}: this trainer runs on 'cpu', 'cuda' or 'mps'")
    if kind == 'cuda' and not dtype:
        dtype = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    dtype = dtype or 'float32'
    if dtype not in ('float32', 'bfloat16', 'float16'):
        raise UserError(f"dtype={dtype!r} is not supported: use 'float32', 'bfloat16' or 'float16' (autocast), or '' for "
                        f"the device's default")
    if kind == 'cuda' and dtype == 'bfloat16' and not torch.cuda.is_bf16_supported():
        raise UserError("dtype='bfloat16' but this GPU has no bfloat16: use --dtype=float16 (with a grad scaler) or float32")
    return device, dtype


def free_memory(device):
    """Bytes free on device now (CUDA: the driver's count; CPU: Linux's MemAvailable), or None where unknown."""
    import torch
    if device.startswith('cuda'):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device == 'cpu' and os.path.exists('/proc/meminfo'):
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    return None


def make_current(device):
    """device 'cuda:N': make GPU N the current one (CUDA graphs, streams and the memory counters use the current
    device). 'cuda' (the current one already), 'cpu', 'mps': nothing to do."""
    import torch
    if device.startswith('cuda') and torch.device(device).index is not None:
        torch.cuda.set_device(device)


def out_of_memory(e):
    """Whether exception e is a device running out of memory: torch's OutOfMemoryError, the CPU allocator's or
    cuBLAS's RuntimeError, or one of them inside another (torch.compile wraps what its compile raised in
    BackendCompilerFailed)."""
    import torch
    while e is not None:
        if isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and any(
                m in str(e) for m in ("can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED"))):
            return True
        e = e.__cause__ or e.__context__
    return False


def _print0(*args):
    if int(os.environ.get('RANK', '0')) == 0:
        print(*args)


def _help(config_globals):
    """The script's docstring, then its settings block: the source lines between the first two '# ---' lines."""
    lines = []
    if config_globals.get('__file__'):
        with open(config_globals['__file__']) as f:
            lines = f.read().splitlines()
    seps = [i for i, line in enumerate(lines) if line.startswith('# ---')]
    block = '\n'.join(lines[seps[0] + 1:seps[1]]) if len(seps) >= 2 else ''
    return (f"{(config_globals.get('__doc__') or '').strip()}\n\n"
            f"Settings (defaults shown), as --key=value or in a config file given first; later ones win:\n{block}")


def unknown_key(key, source, keys):
    """The error for a key the script does not have: the nearest ones, not all of them."""
    near = difflib.get_close_matches(key, sorted(keys), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    return UserError(f"unknown config key '{key}' in {source}{hint} (--help lists every setting)")


def checked(key, value, default, source, nullable=()):
    """Return value converted to the default's type, or raise naming the key and both types."""
    if default is None or (value is None and key in nullable):
        return value  # a None default means "any type" (the script checks what it accepts)
    if isinstance(default, bool) or isinstance(value, bool):
        if isinstance(default, bool) and isinstance(value, bool):
            return value  # bool is an int subclass: keep True/False from passing as 0/1
    elif isinstance(default, float) and isinstance(value, (int, float)):
        if not math.isfinite(value):  # (1e999 parses as inf)
            raise UserError(f"config key '{key}' from {source}: {value!r} is not a finite number")
        return float(value)
    elif isinstance(value, type(default)):
        return value
    raise UserError(f"config key '{key}' from {source}: expected {type(default).__name__} "
                     f"(default {default!r}), got {type(value).__name__} ({value!r})")


def _override(arg, keys, config_globals, nullable):
    """(key, value) of one --key=value argument, the value checked against the key's default."""
    if '=' not in arg:
        raise UserError(f"override '{arg}' must look like --key=value (see --help)")
    key, raw = arg[2:].split('=', 1)
    if key not in keys:
        raise unknown_key(key, arg, keys)
    default = config_globals[key]
    if isinstance(default, str):
        value = raw  # strings stay verbatim: no literal_eval surprises for paths or text
    else:
        try:
            value = literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw
    return key, checked(key, value, default, arg, nullable)


def configure(config_globals, argv, nullable=()):
    """Apply config files and --key=value overrides in argv to the dict config_globals, in order.
    Keys in nullable also accept None."""
    if config_globals.get('__name__') == '__main__':
        sys.excepthook = excepthook
    if '--help' in argv or '-h' in argv:
        _print0(_help(config_globals))
        sys.exit(0)
    keys = {k for k, v in config_globals.items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))}
    # every override is checked before anything runs, so that a config file sees the value an override given after
    # it will set: `head_dim = 128 if 'kda' in mixer else 64` in config/owt.py reads the --mixer of the command line
    overrides = [_override(arg, keys, config_globals, nullable) if arg.startswith('--') else None for arg in argv]
    for i, arg in enumerate(argv):
        if overrides[i] is not None:
            key, value = overrides[i]
            config_globals[key] = value
            _print0(f"Overriding: {key} = {value!r}")
            continue
        if not os.path.isfile(arg):
            raise UserError(f"config file not found: {arg} (a positional argument is a config file, e.g. config/mqar.py; "
                            f"settings go as --key=value)")
        _print0(f"Overriding config with {arg}:")
        with open(arg) as f:
            source = f.read()
        _print0(source)
        # run the file with a copy of the script's globals (so `x = 2 * batch_size` works), as the later overrides
        # will leave them, and with its own path as __file__ (as Python gives any script it runs)
        seen = {k: config_globals[k] for k in keys}
        seen.update(o for o in overrides[i + 1:] if o is not None)
        scope = dict(seen, __file__=arg)
        try:
            exec(compile(source, arg, 'exec'), scope)
        except SyntaxError as e:
            raise UserError(f"config file {arg}, line {e.lineno}: {e.msg} (a config file is Python: plain assignments, "
                            f"e.g. batch_size = 8)") from None
        except Exception as e:  # the file's own code raised: say where, in one line
            tb = e.__traceback__
            line = None
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == arg:
                    line = tb.tb_lineno
                tb = tb.tb_next
            raise UserError(f"config file {arg}{f', line {line}' if line else ''} raised {type(e).__name__}: {e}") from None
        for key, value in scope.items():
            if key.startswith('_') or callable(value) or type(value).__name__ == 'module':
                continue  # imports and helper functions in a config file are not settings
            if key not in keys:
                raise unknown_key(key, arg, keys)
            if value is not seen[key]:  # set by the file
                config_globals[key] = checked(key, value, config_globals[key], arg, nullable)


COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')


def check_training(c):
    """Stop, with one line naming the setting, on any of train.py's settings c that cannot train (GPTConfig checks
    the model's own)."""
    for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters', 'log_interval'):
        if c[k] < 1:
            raise UserError(f"{k}={c[k]} must be >= 1")
    for k in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'min_lr', 'weight_decay', 'grad_clip', 'save_interval'):
        if c[k] < 0:
            raise UserError(f"{k}={c[k]} must be >= 0")
    if not c['learning_rate'] > 0:
        raise UserError(f"learning_rate={c['learning_rate']} must be > 0")
    if not 0 <= c['stop_at_val_acc'] <= 1:
        raise UserError(f"stop_at_val_acc={c['stop_at_val_acc']} must be an accuracy in [0, 1] (0: never stop early)")
    if not (0 <= c['beta1'] < 1 and 0 <= c['beta2'] < 1):
        raise UserError(f"beta1={c['beta1']} and beta2={c['beta2']} must be in [0, 1)")
    if not 0 <= c['seed'] < 2**32 - 2**16:  # numpy's seeds are below 2**32, and each rank adds its rank
        raise UserError(f"seed={c['seed']} must be in [0, 2**32 - 65536)")
    if c['init_from'] not in ('scratch', 'resume'):
        raise UserError(f"init_from must be 'scratch' or 'resume', got {c['init_from']!r}")
    if c.get('optimizer', 'adamw') not in ('adamw', 'muon'):
        raise UserError(f"optimizer must be 'adamw' or 'muon' (Muon for the blocks' matrices, AdamW for the rest), got "
                        f"{c['optimizer']!r}")
    if c.get('lr_schedule', 'cosine') not in ('cosine', 'wsd'):
        raise UserError(f"lr_schedule must be 'cosine' or 'wsd' (warmup-stable-decay), got {c['lr_schedule']!r}")
    if not 0 < c.get('decay_fraction', 0.2) <= 1:
        raise UserError(f"decay_fraction={c['decay_fraction']} must be in (0, 1]: the share of max_iters that wsd "
                        f"decays over")
    if c['compile'] not in (None, True, False):
        raise UserError(f"compile must be None (auto), True or False, got {c['compile']!r}")
    cp = c['context_parallel']
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise UserError(f"context_parallel={cp!r} must be an int >= 1 (the ranks that share a sequence)")
    if cp > 1:
        if c['block_size'] % (2 * cp) or c['block_size'] // (2 * cp) < 4:
            raise UserError(f"context_parallel={cp}: block_size={c['block_size']} must split into 2 × {cp} pieces of "
                            f">= 4 tokens (a multiple of {2 * cp})")
        if c['fsdp']:
            raise UserError("context_parallel > 1 runs under DDP (each rank a full replica), not with fsdp=True")
    if c['fsdp_per_block'] and not c['fsdp']:
        raise UserError("fsdp_per_block=True shapes FSDP's units: it needs --fsdp=True")
    if c['compile_mode'] not in COMPILE_MODES:
        raise UserError(f"compile_mode={c['compile_mode']!r} is not one of torch.compile's modes: "
                        f"{', '.join(COMPILE_MODES)}")
