"""
Checkpoint files and the out_dir they live in: what train.py writes and what train.py (resume) and sample.py read.

    from checkpoint import save_checkpoint, load_checkpoint, lock_out_dir
    lock = lock_out_dir('out')                                 # one run per out_dir, held until the process ends
    save_checkpoint(ckpt, 'out/ckpt.pt', best='out/best.pt')   # atomic; best.pt keeps this one
    ckpt = load_checkpoint('out/ckpt.pt', map_location='cpu')  # data only; errors name the file and what to do

A checkpoint is a dict of plain Python values and tensors: model (the uncompiled model's state_dict), optimizer,
model_args, iter_num, val_loss, best_val_loss, config, and for an exact resume scaler, train_loader (every rank's data
position) and rng (every rank's torch/cuda/numpy/python RNG states, see rng_state). The rules, each tested in
test_train.py / test_model.py / test_trust.py:
- a checkpoint is data, never code: it is read with torch.load(weights_only=True), which builds only tensors and
  plain types, so a file whose pickle would call a function (os.system, ...) is refused before anything runs;
- checkpoints written before 2026-11-26, whose numpy RNG state is a pickled numpy array, still load: the array
  (and only numpy's array and dtype) is allowed for them, and the state is converted to the plain form;
- a save writes a temp file, syncs it and renames it, so an interrupted or failed save (kill -9, disk full) leaves
  the previous checkpoint intact, and a failed one leaves no temp file behind;
- non-finite weights are never saved and never loaded, so a diverged run cannot replace the last good state;
- checkpoints written before the per-layer mixer was named `mixer` (keys `transformer.h.N.attn.*`) load unchanged;
- out_dir's lock is a file beside out_dir (.<name>.lock), not inside it, so deleting and recreating out_dir does
  not free it while a run lives there.
"""
import errno
import math
import os
import random
import re
import shutil
import signal
import socket
import sys
import time

import numpy as np
import torch

from configurator import UserError, out_of_memory


class CheckpointMissing(UserError, FileNotFoundError):
    pass


class CheckpointUnusable(UserError, RuntimeError):
    pass


def nonfinite_tensors(state_dict):
    """Names of the tensors in state_dict holding a NaN or an infinity."""
    return [k for k, v in state_dict.items() if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]


def _cause(e):
    """What went wrong, in words: the errno's text where an OSError is in the chain (torch.save's own error on a
    full disk, 'unexpected pos 17152 vs 17046', hides the OSError that caused it), else the error's first line."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno).lower()
        seen = seen.__cause__ or seen.__context__
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def save_checkpoint(checkpoint, path, best=None):
    """Write checkpoint to path atomically; refuse non-finite weights. best: a second name that keeps this
    checkpoint after later saves replace path (a hard link, so no second write; a copy where links fail).
    A failed write (disk full, read-only, quota) raises a CheckpointUnusable naming the file and the cause; the
    previous file at path is intact and no temp file is left."""
    bad = nonfinite_tensors(checkpoint.get('model', {}))
    if bad:
        raise CheckpointUnusable(f"not saving {path}: {len(bad)} weight tensors are non-finite (first: {bad[0]}); "
                                 f"the previous checkpoint there is kept")
    for target, write in ((path, lambda tmp: _write(checkpoint, tmp)), (best, lambda tmp: _link_or_copy(path, tmp))):
        if target is None:
            continue
        tmp = target + '.tmp'
        try:
            if os.path.lexists(tmp):
                os.remove(tmp)  # a temp file left by a run killed mid-save
            write(tmp)
            os.replace(tmp, target)  # atomic on POSIX: readers see the old file or the new one, never half
        except (OSError, RuntimeError) as e:
            _remove(tmp)
            kept = (f"the previous {os.path.basename(target)} there is intact" if os.path.exists(target)
                    else "there was no earlier one")
            raise CheckpointUnusable(f"could not save {target}: {_cause(e)}; {kept} (free space, or pass another "
                                     f"--out_dir, then resume with --init_from=resume)") from None


def _write(checkpoint, tmp):
    # through a Python file so that a full disk surfaces as OSError(ENOSPC); fsync so that the rename below never
    # makes a file whose bytes are still only in the page cache (a crash would leave an empty ckpt.pt)
    with open(tmp, 'wb') as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())


def _link_or_copy(path, tmp):
    try:
        os.link(path, tmp)  # the next save replaces path with a new file: this one lives on as best
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
            raise
        shutil.copyfile(path, tmp)  # a filesystem without hard links


def remap_old_keys(state_dict):
    """The per-layer mixer was stored as `attn` (nanoGPT's name) before it was renamed `mixer`: map old keys."""
    return {re.sub(r'^(transformer\.h\.\d+\.)attn\.', r'\1mixer.', k): v for k, v in state_dict.items()}


# -----------------------------------------------------------------------------
# RNG states as plain data

def rng_state(device_type, device):
    """This process's RNG states in plain types and tensors (what torch.load(weights_only=True) reads back)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {'torch': torch.get_rng_state(),
            'cuda': torch.cuda.get_rng_state(device) if device_type == 'cuda' else None,
            'numpy': {'bit_generator': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                      'has_gauss': int(has_gauss), 'cached_gaussian': float(cached_gaussian)},
            'python': random.getstate()}


def set_rng_state(rng, device_type):
    torch.set_rng_state(rng['torch'])
    if device_type == 'cuda' and rng.get('cuda') is not None:
        torch.cuda.set_rng_state(rng['cuda'])
    n = rng['numpy']
    np.random.set_state((n['bit_generator'], n['keys'].numpy().astype(np.uint32), n['pos'], n['has_gauss'],
                         n['cached_gaussian']))
    random.setstate(rng['python'])


def _legacy_numpy_globals():
    """numpy's array and dtype, under the names an older checkpoint's pickle gives them (numpy 2's and 1's). They
    build arrays of numbers and nothing else; nothing else is allowed for old checkpoints either."""
    from numpy._core.multiarray import _reconstruct
    return [_reconstruct, (_reconstruct, 'numpy.core.multiarray._reconstruct'), np.ndarray, np.dtype,
            (np.dtype, 'numpy.core.multiarray.dtype')] + [t for t in vars(np.dtypes).values() if isinstance(t, type)]


def _convert_legacy(checkpoint):
    """Checkpoints written before 2026-11-26 hold the numpy RNG state as np.random.get_state()'s tuple with a numpy
    array: convert it to rng_state()'s plain form."""
    for rng in checkpoint.get('rng', None) or []:
        state = rng.get('numpy') if isinstance(rng, dict) else None
        if isinstance(state, tuple):
            name, keys, pos, has_gauss, cached_gaussian = state
            rng['numpy'] = {'bit_generator': name, 'keys': torch.from_numpy(np.asarray(keys).astype(np.int64)),
                            'pos': int(pos), 'has_gauss': int(has_gauss), 'cached_gaussian': float(cached_gaussian)}
    return checkpoint


def _looks_like_torch_save(path):
    """Whether the file starts as torch.save writes: a zip archive, or (legacy) a pickle of protocol 2 or up."""
    try:
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError:
        return True  # let the load's own error speak
    return head == b'PK\x03\x04' or (len(head) >= 2 and head[0] == 0x80 and head[1] >= 2)


# what each reader needs: sample.py the model; a resume the whole training state
NEEDED = {'model': ('model', 'model_args'),
          'resume': ('model', 'model_args', 'optimizer', 'iter_num', 'best_val_loss', 'train_loader')}


def load_checkpoint(path, map_location='cpu', need=None):
    """Read a checkpoint of this trainer as data (weights_only=True: tensors and plain types, no code runs);
    errors are CheckpointMissing / CheckpointUnusable, one line naming the file. need: 'model' (sample.py) or 'resume'
    (train.py) checks that the keys those need are there; None reads any file save_checkpoint wrote."""
    if not os.path.isfile(path):
        raise CheckpointMissing(f"no checkpoint at {path} (train one first, or check out_dir)")
    try:
        try:
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:
            if 'numpy' not in str(e):
                raise
            with torch.serialization.safe_globals(_legacy_numpy_globals()):  # an older checkpoint of ours (see above)
                checkpoint = _convert_legacy(torch.load(path, map_location=map_location, weights_only=True))
    except Exception as e:
        if out_of_memory(e):
            raise UserError(f"out of memory loading checkpoint {path} onto {map_location}: free memory there, or use a "
                            f"device with more") from None
        if not _looks_like_torch_save(path):  # random bytes can parse as a few pickle opcodes: judge by the header
            raise CheckpointUnusable(f"cannot read checkpoint {path}: it holds no pickle of tensors "
                                     f"(a truncated or foreign file? train again or pick another out_dir)") from None
        text = str(e)
        found = re.search(r'GLOBAL (\S+)', text)  # the function or class the pickle would call
        if found or ('Weights only load failed' in text and 'Unsupported operand' not in text):  # (operand: not a pickle)
            lines = [line.strip() for line in text.splitlines()[1:] if line.strip() and 'documentation' not in line]
            what = f"it asks to run {found.group(1)}" if found else (lines[-1] if lines else "it holds something else")
            raise CheckpointUnusable(f"refusing to load {path}: a checkpoint must be tensors and plain values, and {what} "
                                     f"(code, which loading would run); nothing was run. Use a checkpoint written by "
                                     f"train.py, or one from a source you trust converted to plain data") from None
        why = "it holds no pickle of tensors" if 'Unsupported operand' in text else _cause(e)  # (random bytes)
        raise CheckpointUnusable(f"cannot read checkpoint {path}: {why} "
                                 f"(a truncated or foreign file? train again or pick another out_dir)") from None
    missing = [k for k in NEEDED[need] if not (isinstance(checkpoint, dict) and k in checkpoint)] if need else []
    if missing:
        kind = (f"a dict without {', '.join(missing)}" if isinstance(checkpoint, dict)
                else f"a {type(checkpoint).__name__}, not a dict")
        raise CheckpointUnusable(f"{path} is not a checkpoint of this trainer{' that can be resumed' if need == 'resume' else ''}: "
                                 f"it holds {kind}; use a ckpt.pt written by train.py")
    if need and not (isinstance(checkpoint['model'], dict) and isinstance(checkpoint['model_args'], dict)):
        raise CheckpointUnusable(f"{path} is not a checkpoint of this trainer: its model and model_args must be dicts")
    if need == 'resume':
        _check_training_state(checkpoint, path)
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get('model'), dict)):
        return checkpoint
    checkpoint['model'] = remap_old_keys(checkpoint['model'])
    bad = nonfinite_tensors(checkpoint['model'])
    if bad:
        raise CheckpointUnusable(f"checkpoint {path} holds non-finite weights ({len(bad)} tensors, first: {bad[0]}), "
                                 f"from a run that diverged: use an earlier checkpoint or train again")
    return checkpoint


def _check_training_state(ckpt, path):
    """What a resume reads besides the weights, each of the type train.py writes, and the optimizer's state finite:
    a foreign or damaged file is refused in one line naming the key, before anything trains."""
    def kind(k, ok, what):
        if k in ckpt and not ok(ckpt[k]):
            raise CheckpointUnusable(f"{path}: its {k} is {type(ckpt[k]).__name__} {str(ckpt[k])[:40]!r}, not {what}: "
                                     f"not a checkpoint train.py wrote; resume from one it wrote, or start over")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    kind('iter_num', lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an iteration >= 0")
    kind('best_val_loss', number, "a number")
    kind('train_loader', lambda v: isinstance(v, list) and v and all(isinstance(x, dict) for x in v),
         "one data position (a dict) per rank")
    kind('rng', lambda v: isinstance(v, list) and v and all(isinstance(x, dict) for x in v), "RNG states per rank")
    kind('optimizer', lambda v: isinstance(v, dict) and isinstance(v.get('state'), dict)
         and isinstance(v.get('param_groups'), list), "an optimizer state dict")
    kind('config', lambda v: isinstance(v, dict), "a dict of settings")
    kind('scaler', lambda v: isinstance(v, dict), "a grad scaler's state dict")
    bad = [f"{i}.{n}" for i, st in ckpt['optimizer']['state'].items() for n, v in (st.items() if isinstance(st, dict) else ())
           if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointUnusable(f"{path}: its optimizer state holds non-finite values ({len(bad)} tensors, first: "
                                 f"{bad[0]}), which would diverge the run at once: resume from an earlier checkpoint")


def _refuse_unknown(model_args, fields, path):
    """A model_args key that is not a GPTConfig field: a checkpoint of another version or trainer, refused."""
    unknown = sorted(set(model_args) - set(fields))
    if unknown:
        raise CheckpointUnusable(f"{path}: model_args has keys this model.py does not know ({', '.join(unknown)}): "
                                 f"a checkpoint of another version or another trainer")


def build_model(checkpoint, path, model_args):
    """GPT(model_args) with the checkpoint's weights, or one line saying why they do not fit."""
    import dataclasses
    from model import GPT, GPTConfig  # here: a reader of checkpoints need not build models
    _refuse_unknown(model_args, {f.name for f in dataclasses.fields(GPTConfig)}, path)
    model = GPT(GPTConfig(**model_args))
    try:
        model.load_state_dict(checkpoint['model'])
    except RuntimeError as e:
        raise CheckpointUnusable(f"{path}: its weights do not fit the model its model_args describe "
                                 f"({str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e})") from None
    return model


# -----------------------------------------------------------------------------
# out_dir: one run at a time

def lock_path(out_dir):
    """The lock of out_dir: a file beside it, so that it outlives a delete-and-recreate of out_dir; inside out_dir
    only where its parent is not writable (then nobody can delete out_dir either)."""
    full = os.path.realpath(out_dir)  # one lock per folder, however its path is spelled (symlinks, ../)
    parent, name = os.path.split(full)
    return os.path.join(parent, f'.{name}.lock') if os.access(parent, os.W_OK) else os.path.join(full, 'lock')


INHERITED_LOCK = 'OUT_DIR_LOCK_FD'  # grid.py: the fd of out_dir's lock, taken before it cleared out_dir, passed on


def lock_out_dir(out_dir):
    """Hold out_dir's lock while this process lives, so that a second run there (or a grid.py clearing it) stops at
    once instead of mixing logs and checkpoints. The OS drops the lock with the process, even at kill -9: a stale one
    never blocks. A lock handed down by grid.py (INHERITED_LOCK) is adopted. Returns the open lock file."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        return None
    path = lock_path(out_dir)
    fd = os.environ.pop(INHERITED_LOCK, None)
    f = None
    if fd is not None:
        try:
            st, mine = os.fstat(int(fd)), os.stat(path)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                f = os.fdopen(int(fd), 'a+')
        except (OSError, ValueError):
            f = None
    if f is None:
        try:
            f = open(path, 'a+')
        except OSError as e:
            raise UserError(f"cannot create the lock {path} of out_dir {out_dir!r}: {_cause(e)}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # on an adopted lock: already ours, succeeds
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'pid unknown'
        f.close()
        raise UserError(f"out_dir {out_dir!r} is in use by another run ({holder}): wait for it, "
                        f"stop it, or pass another --out_dir") from None
    try:
        same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except OSError:
        same = False
    if not same:  # the file was removed (and maybe made anew) between our open and our lock: lock the one there now
        f.close()
        return lock_out_dir(out_dir)
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f  # kept open for the whole run: closing it would release the lock


def out_dir_user(out_dir):
    """Who holds out_dir's lock (its line, e.g. 'pid 123 on host since ...'), or None when nobody does."""
    try:
        import fcntl
    except ImportError:
        return None
    path = lock_path(out_dir)
    if not os.path.exists(path):
        return None
    with open(path, 'a+') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            return f.read().strip() or 'pid unknown'
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


# -----------------------------------------------------------------------------
# out_dir: the run's folder, its log, and what a run does there

class OutDir:
    """The run's out_dir, made and locked (rank 0 holds the lock) before anything is written there, with its log.

    A run from scratch never replaces an earlier run's ckpt.pt or best.pt: overwrite=True deletes them (and what the
    run and the tools wrote beside them: log.txt, pictures, longctx-*.json) and starts over, else it stops with a line
    saying what to do. `notices` holds the lines to log once the log is open. log(line) appends to log.txt and prints
    (rank 0 only; terminal=False: log.txt only)."""

    def __init__(self, path, master=True, init_from='scratch', overwrite=False, eval_only=False):
        self.path, self.master, self.notices, self.lock = path, master, [], None
        self.ckpt, self.best, self.log_path = (os.path.join(path, n) for n in ('ckpt.pt', 'best.pt', 'log.txt'))
        if os.path.exists(path) and not os.path.isdir(path):
            raise UserError(f"out_dir {path!r} is a file, not a folder: pass another --out_dir")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create out_dir {path!r}: {_cause(e)}: pass another --out_dir") from None
        if not master:
            return
        if not os.access(path, os.W_OK):
            raise UserError(f"out_dir {path!r} is not writable (read-only file system or permissions): pass another "
                            f"--out_dir")
        self.lock = lock_out_dir(path)  # before looking at its files: a live run there may be writing them
        earlier = [n for n in ('ckpt.pt', 'best.pt') if os.path.exists(os.path.join(path, n))]
        if init_from != 'scratch' or eval_only or not earlier:
            return
        if not overwrite:
            raise UserError(f"out_dir {path!r} holds an earlier run's {' and '.join(earlier)}: continue that run with "
                            f"--init_from=resume, start over with --overwrite=True (deletes it), or pass another --out_dir")
        made = [n for n in sorted(os.listdir(path)) if n == 'log.txt' or n.endswith('.png')  # by train.py and the
                or (n.startswith('longctx-') and n.endswith('.json'))]                    # tools: plot, longctx
        gone = earlier + made
        for n in gone:
            os.remove(os.path.join(path, n))
        self.notices.append(f"overwrite=True: deleted the earlier run's {', '.join(gone)} in {path}")

    def log(self, *args, terminal=True):
        """Print on rank 0 and append the same line to log.txt. The log first: a line seen on the terminal is in
        log.txt already."""
        if not self.master:
            return
        line = ' '.join(str(a) for a in args)
        try:
            with open(self.log_path, 'a') as f:
                f.write(line + '\n')
        except OSError as e:  # a full disk, a quota, a deleted folder: say which, not a traceback
            if not os.path.isdir(self.path):
                raise UserError(f"out_dir {self.path!r} was deleted while this run wrote to it: nothing more is saved "
                                f"there; start the run again (or from a copy of its ckpt.pt)") from None
            raise UserError(f"cannot write {self.log_path}: {_cause(e)}: free space or pass another --out_dir "
                            f"(the checkpoints there are as they were)") from None
        if terminal:
            print(line, flush=True)

    def progress(self, total, desc):
        """A progress bar on stderr for work between two log lines (rank 0, on a terminal, shown once it has run for
        a second, erased when done)."""
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, leave=False, delay=1.0, dynamic_ncols=True,
                    disable=not (self.master and sys.stderr.isatty()))

    def wandb(self, project, name, mode, config):
        """Start wandb (rank 0; imported only here) -> the module, or None on other ranks. A setting given in the
        config wins; else wandb's environment variable (WANDB_PROJECT, WANDB_NAME, WANDB_MODE); else linear-gpt,
        out_dir's name, online. WANDB_MODE=offline needs no API key."""
        if not self.master:
            return None
        try:
            import wandb
        except ImportError:
            raise UserError("wandb_log=True but wandb is not installed: pip install wandb, or --wandb_log=False") from None
        try:
            wandb.init(project=project or os.environ.get('WANDB_PROJECT') or 'linear-gpt',
                       name=name or os.environ.get('WANDB_NAME') or os.path.basename(os.path.abspath(self.path)),
                       mode=mode or os.environ.get('WANDB_MODE') or 'online', config=config)
        except Exception as e:  # no API key, no network, a bad mode: one line, not wandb's traceback
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"wandb.init failed: {why} (or log offline: WANDB_MODE=offline or --wandb_mode=offline; "
                            f"or --wandb_log=False)") from None
        return wandb


def model_settings(checkpoint, path, asked, notices):
    """On resume, what the checkpoint may set: the model's shape, its model_args that are GPTConfig fields (`asked`:
    this run's values), each type-checked against this run's; dropout stays this run's, and so does kernels when
    given. Every value that differs from what the config asked for gets a line in notices. -> {setting: value}. A key of
    model_args that is not a GPTConfig field refuses the file: a checkpoint never steers the trainer."""
    from configurator import checked
    _refuse_unknown(checkpoint['model_args'], asked, path)
    taken = {}
    for k, v in checkpoint['model_args'].items():
        if k == 'dropout' or (k == 'kernels' and asked[k]):
            continue
        v, now = checked(k, v, asked[k], path), (asked[k] or 'auto') if k == 'kernels' else asked[k]
        if v != now:
            notices.append(f"resume: {k} = {v!r} from the checkpoint (the config asked for {now!r})")
            taken[k] = v
    return taken


class StopSignals:
    """SIGTERM (preemption, a scheduler's stop) and SIGINT (Ctrl-C) stop the run at the end of the step under way,
    where it saves ckpt.pt and exits with 128 + the signal's number. `requested` is the signal this process got (0:
    none); the loop agrees on it with the other ranks at the step's end. A second Ctrl-C, or a signal before the first
    step has finished (`started` False: nothing to save), exits at once, leaving the checkpoints as they were; a repeated
    SIGTERM (SLURM signals every rank, and torchrun forwards its own too) never cancels the save under way."""

    def __init__(self, out_dir):
        self.out_dir, self.requested, self.started = out_dir, 0, False
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, signum, frame):
        prog = os.path.basename(sys.argv[0])
        if self.requested and signum == signal.SIGTERM:  # a scheduler's repeat (torchrun forwards its own): the
            return                                        # save goes on; only a second Ctrl-C means "now"
        if self.requested or not self.started:
            what = "again" if self.requested else "before the first step"
            # os.write, not print: a print here could land inside one the loop is making and raise
            os.write(2, f"{prog}: {signal.Signals(signum).name} {what}: exiting now without saving\n".encode())
            if self.out_dir.master:  # a save under way: the previous files stay, the temp goes, and the log says so
                for path in (self.out_dir.ckpt, self.out_dir.best):
                    _remove(path + '.tmp')
                try:
                    fd = os.open(self.out_dir.log_path, os.O_WRONLY | os.O_APPEND)
                    os.write(fd, f"{signal.Signals(signum).name} {what}: exited without saving\n".encode())
                    os.close(fd)
                except OSError:
                    pass
            os._exit(128 + signum)
        self.requested = signum
        if self.out_dir.master:
            again = " (again: exit at once)" if signum == signal.SIGINT else ""
            os.write(2, f"{prog}: {signal.Signals(signum).name}: finishing this step, then saving{again}\n".encode())


class Divergence:
    """The rule that stops a diverged run before anything non-finite reaches a checkpoint: a non-finite loss or
    gradient norm on any rank stops it (under the fp16 grad scaler, which skips such steps itself: 16 skipped in a row,
    its scale down by 65536); a loss past 2x the run's first is warned about (then at each further doubling)."""

    def __init__(self, ckpt_path, learning_rate, grad_clip, fp16=False, warn=print):
        self.ckpt_path, self.learning_rate, self.grad_clip, self.fp16, self.warn = (ckpt_path, learning_rate, grad_clip,
                                                                                    fp16, warn)
        self.skipped, self.first, self.warn_at = 0, None, None

    def check(self, n, loss, norm, nonfinite_anywhere):
        """Step n's numbers (the mean loss, the gradient norm, whether any rank saw a non-finite one)."""
        self.skipped = self.skipped + 1 if self.fp16 and not math.isfinite(norm) else 0
        if not math.isfinite(loss) or (nonfinite_anywhere and not self.fp16) or self.skipped > 16:
            raise self.error(f"loss {loss:.4g}, gradient norm {norm:.4g}", n)
        if self.first is None:
            self.first, self.warn_at = loss, 2 * loss
        elif loss > self.warn_at > 0:
            self.warn(f"warning: iter {n}: loss {loss:.4f} is {loss / self.first:.1f}x this run's first "
                      f"({self.first:.4f}): the run may be diverging (lower learning_rate, or set grad_clip)")
            self.warn_at = 2 * loss

    def error(self, what, n):
        kept = f"{self.ckpt_path} keeps the last good state" if os.path.exists(self.ckpt_path) else "no checkpoint was written"
        clip = (f"lower grad_clip (now {self.grad_clip:g})" if self.grad_clip > 0
                else "set grad_clip > 0 (now 0: off), e.g. 1.0")
        return UserError(f"training diverged at iter {n}: {what}; nothing was saved ({kept}): lower learning_rate "
                         f"(now {self.learning_rate:g}) or {clip}")
