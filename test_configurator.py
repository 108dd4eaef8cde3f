"""
Configurator tests: config files, --key=value overrides, type checks and their error messages.

$ python -m pytest test_configurator.py -q
"""
import pytest

from configurator import configure


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
    with pytest.raises(FileNotFoundError, match='config file not found'):
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
