"""
Configurator tests: config files, --key=value overrides, type checks and their error messages.

$ python -m pytest tests/test_configurator.py -q
"""
import os

import pytest

from configurator import UserError, configure, device_and_dtype, excepthook


def defaults():
    return dict(n_layer=12, learning_rate=6e-4, compile=True, out_dir='out', top_k=None, mixer='softmax')


def test_overrides_keep_types():
    g = defaults()
    configure(g, ['--n_layer=4', '--learning_rate=1', '--compile=False', '--out_dir=123', '--top_k=50', '--mixer=kda*3,softmax'])
    assert g['n_layer'] == 4 and type(g['n_layer']) is int
    assert g['learning_rate'] == 1.0 and type(g['learning_rate']) is float  # int accepted where float expected
    assert g['compile'] is False
    assert g['out_dir'] == '123'                                             # str keys stay strings
    assert g['top_k'] == 50                                                  # None default accepts anything
    assert g['mixer'] == 'kda*3,softmax'


def test_split_on_first_equals_only():
    g = defaults()
    configure(g, ['--out_dir=a=b'])
    assert g['out_dir'] == 'a=b'


def test_unknown_key_is_an_error():
    with pytest.raises(ValueError, match="unknown config key 'n_layers'"):
        configure(defaults(), ['--n_layers=4'])


@pytest.mark.parametrize('arg,msg', [
    ('--n_layer=4.5', "'n_layer'.*expected int.*got float"),
    ('--n_layer=True', "'n_layer'.*expected int.*got bool"),
    ('--compile=1', "'compile'.*expected bool.*got int"),
    ('--learning_rate=fast', "'learning_rate'.*expected float.*got str"),
])
def test_wrong_type_names_key_and_types(arg, msg):
    with pytest.raises(ValueError, match=msg):
        configure(defaults(), [arg])


def test_config_file_then_override(tmp_path):
    cfg = tmp_path / 'c.py'
    cfg.write_text("# a config\nn_layer = 6\nlearning_rate = 3e-4\n")
    g = defaults()
    configure(g, [str(cfg), '--n_layer=8'])  # later sources win
    assert g['n_layer'] == 8 and g['learning_rate'] == 3e-4


def test_config_file_errors(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text("n_layerz = 6\n")
    with pytest.raises(ValueError, match=f"unknown config key 'n_layerz' in {bad}"):
        configure(defaults(), [str(bad)])
    bad.write_text("n_layer = '6'\n")
    with pytest.raises(ValueError, match="'n_layer'.*expected int.*got str"):
        configure(defaults(), [str(bad)])
    with pytest.raises(UserError, match='config file not found'):
        configure(defaults(), [str(tmp_path / 'missing.py')])
    with pytest.raises(ValueError, match='--key=value'):
        configure(defaults(), ['--n_layer'])


def test_config_file_sees_script_globals(tmp_path):
    cfg = tmp_path / 'c.py'
    cfg.write_text("n_layer = 2 * n_layer\nout_dir = out_dir + '-x'\nsizes = [n_layer * i for i in range(3)]\nn_layer = sizes[1]\n".replace('sizes', '_sizes'))
    g = defaults()
    configure(g, [str(cfg)])
    assert g['n_layer'] == 24 and g['out_dir'] == 'out-x'


def test_none_only_where_default_is_none():
    with pytest.raises(ValueError, match="'n_layer'.*expected int.*got NoneType"):
        configure(defaults(), ['--n_layer=None'])
    g = defaults()
    configure(g, ['--top_k=None'])
    assert g['top_k'] is None


# -----------------------------------------------------------------------------
# one-line user errors, --help, None where a script allows it, the device and dtype checked up front

def test_every_configurator_error_is_a_user_error(tmp_path):
    """A UserError is what the scripts print as one line; it stays a ValueError for older callers."""
    for argv in (['--n_layers=4'], ['--n_layer=4.5'], ['--n_layer'], [str(tmp_path / 'missing.py')]):
        with pytest.raises(UserError):
            configure(defaults(), argv)
    assert issubclass(UserError, ValueError)


def test_nullable_keys_accept_none():
    """sample.py's top_k defaults to 200 but its comment says 'None = all': a nullable key takes None."""
    g = defaults()
    configure(g, ['--n_layer=None'], nullable={'n_layer'})
    assert g['n_layer'] is None
    g = defaults()
    configure(g, ['--n_layer=3'], nullable={'n_layer'})  # and still checks the type otherwise
    assert g['n_layer'] == 3
    with pytest.raises(UserError, match="'n_layer'.*expected int"):
        configure(defaults(), ['--n_layer=x'], nullable={'n_layer'})


def test_help_prints_docstring_and_settings_block(tmp_path, capsys):
    script = tmp_path / 'script.py'
    script.write_text('"""What the script does."""\nimport sys\n# ---\n# model\nn_layer = 12   # layers; 12 for GPT-2\n'
                      '# ---\nconfig_keys = []\n')
    g = dict(defaults(), __file__=str(script), __doc__='What the script does.')
    for flag in ('--help', '-h'):
        with pytest.raises(SystemExit) as e:
            configure(dict(g), ['--n_layer=3', flag])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert 'What the script does.' in out and 'n_layer = 12   # layers; 12 for GPT-2' in out
        assert 'config_keys' not in out and 'Overriding' not in out


def test_excepthook_one_line_for_user_errors_traceback_for_bugs(capfd, monkeypatch):
    """A UserError prints one line and no traceback; any other exception (a bug) keeps its full traceback."""
    monkeypatch.delenv('RANK', raising=False)
    monkeypatch.setattr('sys.argv', ['train.py'])

    def raised(exc):
        try:
            raise exc
        except Exception as e:
            return type(e), e, e.__traceback__

    excepthook(*raised(UserError("n_layer=0 must be an integer >= 1")))
    err = capfd.readouterr().err
    assert err == "train.py: error: n_layer=0 must be an integer >= 1\n"
    excepthook(*raised(ZeroDivisionError("division by zero")))
    err = capfd.readouterr().err
    assert err.startswith('Traceback (most recent call last):') and 'ZeroDivisionError: division by zero' in err


def test_device_and_dtype_are_checked():
    import torch
    assert device_and_dtype('cpu', '') == ('cpu', 'float32')
    assert device_and_dtype('cpu', 'bfloat16') == ('cpu', 'bfloat16')  # honoured on CPU too (autocast), not ignored
    with pytest.raises(UserError, match="dtype='float64' is not supported.*'float32', 'bfloat16' or 'float16'"):
        device_and_dtype('cpu', 'float64')
    with pytest.raises(UserError, match="device='gpu' is not a device name"):
        device_and_dtype('gpu', '')
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="device='cuda' but .* sees no CUDA GPU here: use --device=cpu"):
            device_and_dtype('cuda', '')


def test_config_file_sees_the_overrides_after_it(tmp_path):
    """A rule in a config file reads the command line's choice (config/owt.py: KDA gets 128-wide heads); the
    overrides still win over the file, and a file's own assignment wins over an earlier override."""
    cfg = tmp_path / 'c.py'
    cfg.write_text("n_layer = 24 if 'kda' in mixer else 12\n")
    for argv, n_layer in (([str(cfg)], 12), ([str(cfg), '--mixer=kda*3,softmax'], 24), (['--mixer=kda', str(cfg)], 24),
                          ([str(cfg), '--mixer=kda', '--n_layer=3'], 3)):
        g = defaults()
        configure(g, argv)
        assert g['n_layer'] == n_layer, argv
    sets = tmp_path / 'sets.py'
    sets.write_text("mixer = 'gdn'\nn_layer = 24 if 'kda' in mixer else 12\n")
    g = defaults()
    configure(g, ['--mixer=kda', str(sets)])
    assert (g['mixer'], g['n_layer']) == ('gdn', 12)
    g = defaults()
    configure(g, [str(sets), '--mixer=kda'])
    assert (g['mixer'], g['n_layer']) == ('kda', 12)  # the file set mixer itself before its rule read it


def test_config_file_knows_its_path(tmp_path):
    """__file__ is the config file's path, so a config can build on another one beside it (config/kda_hybrid.py)."""
    (tmp_path / 'base.py').write_text("n_layer = 6\nlearning_rate = 3e-4\n")
    (tmp_path / 'c.py').write_text("from pathlib import Path\nexec(Path(__file__).with_name('base.py').read_text())\n"
                                   "n_layer = 8\n")
    g = defaults()
    configure(g, [str(tmp_path / 'c.py')])
    assert g['n_layer'] == 8 and g['learning_rate'] == 3e-4


def test_ctrl_c_before_a_script_handles_it_is_one_line():
    """Ctrl-C while train.py loaded a checkpoint (before its own handler) printed a 19-line KeyboardInterrupt."""
    import subprocess
    import sys
    code = ("import sys; sys.argv = ['train.py']; import configurator; sys.excepthook = configurator.excepthook; "
            "raise KeyboardInterrupt")
    p = subprocess.run([sys.executable, '-c', code], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 130 and p.stderr == 'train.py: interrupted (Ctrl-C); nothing was saved\n', p.stderr


def test_out_of_memory_is_recognised_directly_and_inside_another_error():
    import torch
    from configurator import out_of_memory
    cpu = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory")) and out_of_memory(cpu)
    try:
        try:
            raise cpu
        except RuntimeError as e:
            raise RuntimeError("backend='inductor' raised:") from e  # what torch.compile's BackendCompilerFailed does
    except RuntimeError as wrapped:
        assert out_of_memory(wrapped)
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError("x"))


def test_make_current_sets_only_a_numbered_gpu(monkeypatch):
    """'cuda' is the current GPU already (torch.cuda.set_device refuses a device without an index); 'cuda:1' is set."""
    import torch
    from configurator import make_current
    calls = []
    monkeypatch.setattr(torch.cuda, 'set_device', calls.append)
    for device in ('cuda', 'cpu', 'mps', 'cuda:1'):
        make_current(device)
    assert calls == ['cuda:1'], calls
