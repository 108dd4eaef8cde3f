"""
nanoGPT-style configuration: config files, then --key=value overrides.

    python train.py config/pystdlib_kda_hybrid.py --batch_size=8 --compile=False

Used from train.py / sample.py as

    from configurator import configure
    configure(globals(), sys.argv[1:])

Rules (nanoGPT's, made strict):
- a positional argument is a config file; it is exec'd with the script's globals, in order;
- `--key=value` must name an existing global; the value goes through `ast.literal_eval`
  and falls back to the raw string; only the first '=' splits, so `--start="a=b"` works;
- the type must match the default's: an int is accepted where a float is expected, a `None`
  default accepts anything, a str default keeps the raw text (`--out_dir=123` is the string '123');
- an unknown key or a wrong type is a ValueError naming the key, the source and both types;
- later sources override earlier ones. Only rank 0 prints (RANK unset or '0').
"""
import os
from ast import literal_eval


def _print0(*args):
    if int(os.environ.get('RANK', '0')) == 0:
        print(*args)


def _checked(key, value, default, source):
    """Return value converted to the default's type, or raise naming the key and both types."""
    if default is None:
        return value  # a None default means "any type" (the script checks what it accepts)
    if isinstance(default, bool) or isinstance(value, bool):
        if isinstance(default, bool) and isinstance(value, bool):
            return value  # bool is an int subclass: keep True/False from passing as 0/1
    elif isinstance(default, float) and isinstance(value, int):
        return float(value)
    elif isinstance(value, type(default)):
        return value
    raise ValueError(f"config key '{key}' from {source}: expected {type(default).__name__} "
                     f"(default {default!r}), got {type(value).__name__} ({value!r})")


def configure(config_globals, argv):
    """Apply config files and --key=value overrides in argv to the dict config_globals, in order."""
    keys = {k for k, v in config_globals.items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))}
    for arg in argv:
        if not arg.startswith('--'):
            if not os.path.isfile(arg):
                raise FileNotFoundError(f"config file not found: {arg}")
            _print0(f"Overriding config with {arg}:")
            with open(arg) as f:
                source = f.read()
            _print0(source)
            # run the file with a copy of the script's globals, so `x = 2 * batch_size` works
            scope = {k: config_globals[k] for k in keys}
            exec(compile(source, arg, 'exec'), scope)
            for key, value in scope.items():
                if key.startswith('_') or callable(value) or type(value).__name__ == 'module':
                    continue  # imports and helper functions in a config file are not settings
                if key not in keys:
                    raise ValueError(f"unknown config key '{key}' in {arg}; valid keys: {', '.join(sorted(keys))}")
                if value is not config_globals[key]:
                    config_globals[key] = _checked(key, value, config_globals[key], arg)
        else:
            if '=' not in arg:
                raise ValueError(f"override '{arg}' must look like --key=value")
            key, raw = arg[2:].split('=', 1)
            if key not in keys:
                raise ValueError(f"unknown config key '{key}' in {arg}; valid keys: {', '.join(sorted(keys))}")
            default = config_globals[key]
            if isinstance(default, str):
                value = raw  # strings stay verbatim: no literal_eval surprises for paths or text
            else:
                try:
                    value = literal_eval(raw)
                except (SyntaxError, ValueError):
                    value = raw
            config_globals[key] = _checked(key, value, default, arg)
            _print0(f"Overriding: {key} = {config_globals[key]!r}")
