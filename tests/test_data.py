"""
Tests of the data layer: the llm.c shard format, the batch loader, and the prepare scripts on
tiny local inputs (CPU, offline, a few seconds).

    python -m pytest tests/test_data.py -q
"""
import io
import json
import os
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch

from configurator import UserError
from dataloader import (HEADER_INTS, MAGIC, VERSION, ShardLoader, ShardWriter,
                        gpt2_encoding, read_header, read_shard, shard_paths, shared_tiktoken_cache, write_shard)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository

sys.path.insert(0, os.path.join(HERE, 'data', 'openwebtext'))
import prepare as owt_prepare  # noqa: E402
sys.path.pop(0)
del sys.modules['prepare']  # both datasets name their script prepare.py
sys.path.insert(0, os.path.join(HERE, 'data', 'pystdlib'))
import prepare as pystdlib_prepare  # noqa: E402
sys.path.pop(0)
del sys.modules['prepare']

enc = gpt2_encoding()  # offline: TIKTOKEN_CACHE_DIR, or a shared/tiktoken copy (see dataloader.py)
EOT = 50256


# -----------------------------------------------------------------------------
# shard format

def test_shard_round_trip(tmp_path):
    path = str(tmp_path / 'x_train_000000.bin')
    tokens = np.array([0, 1, 50256, 65535, 123], dtype=np.int64)
    write_shard(path, tokens)
    header = np.fromfile(path, dtype='<i4', count=HEADER_INTS)
    assert (header[0], header[1], header[2]) == (MAGIC, VERSION, 5)
    assert not header[3:].any()
    assert os.path.getsize(path) == 4 * HEADER_INTS + 2 * len(tokens)
    for mmap in (True, False):
        out = read_shard(path, mmap=mmap)
        assert out.dtype == np.uint16 and out.tolist() == tokens.tolist()
    write_shard(path, [])  # an empty shard is legal
    assert len(read_shard(path)) == 0
    assert not [f for f in os.listdir(tmp_path) if 'tmp' in f]  # the atomic write cleans up


def _edit_header(path, index, value):
    header = np.fromfile(path, dtype='<i4', count=HEADER_INTS)
    header[index] = value
    with open(path, 'r+b') as f:
        f.write(header.tobytes())


def test_bad_shards_name_the_file(tmp_path):
    path = str(tmp_path / 'bad_train_000000.bin')
    write_shard(path, np.arange(100))
    _edit_header(path, 0, 123)
    with pytest.raises(ValueError, match=r'bad_train_000000\.bin: bad magic 123'):
        read_shard(path)

    write_shard(path, np.arange(100))
    _edit_header(path, 1, 7)
    with pytest.raises(ValueError, match=r'bad_train_000000\.bin: unsupported version 7'):
        read_shard(path)

    write_shard(path, np.arange(100))
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) - 10)  # cut off the last 5 tokens
    with pytest.raises(ValueError, match=r'bad_train_000000\.bin: truncated: header says 100 tokens but file holds 95'):
        read_shard(path)

    with open(path, 'wb') as f:  # shorter than a header
        f.write(b'hello')
    with pytest.raises(ValueError, match=r'bad_train_000000\.bin'):
        read_shard(path)

    with pytest.raises(UserError, match=r'nope\.bin'):
        read_shard(str(tmp_path / 'nope.bin'))


def test_write_shard_rejects_out_of_range(tmp_path):
    with pytest.raises(ValueError, match='65536'):
        write_shard(str(tmp_path / 'a.bin'), [1, 2, 65536])
    with pytest.raises(ValueError):
        write_shard(str(tmp_path / 'a.bin'), [-1])
    assert not os.listdir(tmp_path)


def test_shard_writer_splits_into_shards(tmp_path):
    w = ShardWriter(str(tmp_path), 'ds', 'train', shard_size=10)
    w.add(np.arange(7))
    w.add(np.arange(7, 25))  # spans three shards
    paths = w.close()
    assert [os.path.basename(p) for p in paths] == [f'ds_train_00000{i}.bin' for i in range(3)]
    assert np.concatenate([read_shard(p) for p in paths]).tolist() == list(range(25))
    assert w.ntok == 25
    # a rerun with bigger shards removes the stale extra ones
    w = ShardWriter(str(tmp_path), 'ds', 'train', shard_size=100)
    w.add(np.arange(5))
    assert len(w.close()) == 1
    assert sorted(os.listdir(tmp_path)) == ['ds_train_000000.bin']


# -----------------------------------------------------------------------------
# ShardLoader

def _make_dataset(tmp_path, sizes, name='toy'):
    """Shards of consecutive integers (shard i starts at 1000*i), so every token says where it came from."""
    data_dir = tmp_path / name
    data_dir.mkdir()
    for i, n in enumerate(sizes):
        write_shard(str(data_dir / f'{name}_train_{i:06d}.bin'), 1000 * i + np.arange(n))
    return str(data_dir)


def test_loader_shifts_and_shapes(tmp_path):
    data_dir = _make_dataset(tmp_path, [200])
    loader = ShardLoader(data_dir, 'train', batch_size=2, block_size=8)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (2, 8) and x.dtype == y.dtype == torch.int64
    assert x.flatten().tolist() == list(range(16))
    assert y.flatten().tolist() == list(range(1, 17))
    x, y = loader.next_batch()
    assert x[0, 0].item() == 16  # consecutive steps are contiguous


def test_loader_ranks_read_disjoint_slices(tmp_path):
    data_dir = _make_dataset(tmp_path, [500])
    B, T = 2, 4
    r0 = ShardLoader(data_dir, 'train', B, T, rank=0, world_size=2)
    r1 = ShardLoader(data_dir, 'train', B, T, rank=1, world_size=2)
    seen = []
    for step in range(3):
        x0, _ = r0.next_batch()
        x1, _ = r1.next_batch()
        base = step * B * T * 2
        assert x0.flatten().tolist() == list(range(base, base + B * T))
        assert x1.flatten().tolist() == list(range(base + B * T, base + 2 * B * T))
        seen += x0.flatten().tolist() + x1.flatten().tolist()
    assert len(seen) == len(set(seen))
    assert r0.state_dict() == r1.state_dict()  # all ranks agree on the position


def test_loader_resume_is_exact(tmp_path):
    data_dir = _make_dataset(tmp_path, [100, 120, 90])
    a = ShardLoader(data_dir, 'train', batch_size=2, block_size=8)
    for _ in range(7):  # far enough to have crossed a shard boundary
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch() for _ in range(10)]
    b = ShardLoader(data_dir, 'train', batch_size=2, block_size=8)
    b.load_state_dict(dict(state))
    for x, y in expected:
        xb, yb = b.next_batch()
        assert torch.equal(x, xb) and torch.equal(y, yb)
    b.reset()
    assert b.next_batch()[0][0, 0].item() == 0


def test_loader_rolls_over_shards_and_wraps(tmp_path):
    data_dir = _make_dataset(tmp_path, [40, 40])
    loader = ShardLoader(data_dir, 'train', batch_size=1, block_size=16)
    firsts = [loader.next_batch()[0][0, 0].item() for _ in range(5)]
    # each shard gives 2 batches of 16 (+1 target); the tail of 40 - 32 = 8 tokens is skipped
    assert firsts == [0, 16, 1000, 1016, 0]


def test_loader_errors(tmp_path):
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'empty' / 'prepare.py').write_text('')
    with pytest.raises(UserError, match=r'python data/empty/prepare\.py'):
        ShardLoader(str(tmp_path / 'empty'), 'train', 2, 8)
    data_dir = _make_dataset(tmp_path, [100, 10])
    with pytest.raises(ValueError, match=r'toy_train_000001\.bin: shard holds 10 tokens.*17'):
        ShardLoader(data_dir, 'train', batch_size=2, block_size=8)


# -----------------------------------------------------------------------------
# data/openwebtext/prepare.py on tiny local inputs

DOCS = [
    "Hello world. This is the first document.",
    "A second one, with unicode: café, naïve, 日本語.",
    "Short.",
    "The fourth document talks about tokenizers and shards " * 5,
    "Fifth: numbers 1234567890 and symbols <|endoftext|> stay ordinary text.",
    "Sixth and last document of the text files.",
]
JSONL_DOCS = ["json doc one", "json doc two\nwith a newline", "json doc three"]


def _expected_tokens(texts):
    return sum(1 + len(enc.encode_ordinary(t)) for t in texts)


def _check_owt_output(out_dir, texts, min_train_shards=2):
    val, train = shard_paths(out_dir, 'val'), shard_paths(out_dir, 'train')
    assert len(train) >= min_train_shards
    tokens = np.concatenate([read_shard(p) for p in val + train])
    assert len(tokens) == _expected_tokens(texts)
    assert (tokens == EOT).sum() == len(texts)  # one EOT per document (ordinary text never encodes to it)
    for p in val + train[:1]:
        assert read_shard(p)[0] == EOT  # each split starts at a document boundary
    # the documents themselves are there: decode each piece between EOT tokens (split on the token,
    # not the string: one document holds the text '<|endoftext|>') and compare as multisets
    starts = np.flatnonzero(tokens == EOT).tolist() + [len(tokens)]
    pieces = [enc.decode(tokens[a + 1:b].tolist()) for a, b in zip(starts[:-1], starts[1:])]
    assert sorted(pieces) == sorted(texts)


def test_owt_prepare_folder(tmp_path):
    src = tmp_path / 'src'
    (src / 'sub').mkdir(parents=True)
    for i, text in enumerate(DOCS):
        (src / ('sub' if i % 2 else '') / f'doc{i}.txt').write_text(text, encoding='utf-8')
    with open(src / 'more.jsonl', 'w', encoding='utf-8') as f:
        for text in JSONL_DOCS:
            f.write(json.dumps({'text': text}) + '\n')
    out_dir = str(tmp_path / 'openwebtext')
    owt_prepare.main(['--input', str(src), '--out_dir', out_dir, '--num_proc', '1', '--shard_size', '40',
                      '--val_tokens', '20'])
    _check_owt_output(out_dir, DOCS + JSONL_DOCS)


def _tar_xz_bytes(files):
    """An in-memory .tar.xz of {name: bytes}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w:xz') as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_owt_prepare_tar_xz(tmp_path):
    # the original layout: openwebtext.tar.xz > openwebtext/urlsf_subsetXX-YY_data.xz > *.txt
    inner0 = _tar_xz_bytes({f'0000{i}-abc.txt': t.encode('utf-8') for i, t in enumerate(DOCS[:4])})
    inner1 = _tar_xz_bytes({f'0001{i}-def.txt': t.encode('utf-8') for i, t in enumerate(DOCS[4:])})
    archive = tmp_path / 'openwebtext.tar.xz'
    archive.write_bytes(_tar_xz_bytes({'openwebtext/urlsf_subset00-1_data.xz': inner0,
                                       'openwebtext/urlsf_subset00-2_data.xz': inner1}))
    out_dir = str(tmp_path / 'openwebtext')
    # through the command line, with 2 processes, as a user would run it
    cmd = [sys.executable, os.path.join(HERE, 'data', 'openwebtext', 'prepare.py'), '--input', str(archive),
           '--out_dir', out_dir, '--num_proc', '2', '--shard_size', '30', '--val_tokens', '20']
    subprocess.run(cmd, check=True, capture_output=True)
    _check_owt_output(out_dir, DOCS)


def test_owt_local_split_is_deterministic(tmp_path):
    src = tmp_path / 'src'
    src.mkdir()
    for i, text in enumerate(DOCS):
        (src / f'doc{i}.txt').write_text(text, encoding='utf-8')
    runs = []
    for run in range(2):
        out_dir = str(tmp_path / f'run{run}' / 'openwebtext')
        owt_prepare.main(['--input', str(src), '--out_dir', out_dir, '--num_proc', '1', '--val_fraction', '0.3',
                          '--val_tokens', '10'])
        runs.append([read_shard(p).tolist() for s in ('val', 'train') for p in shard_paths(out_dir, s)])
    assert runs[0] == runs[1]
    assert owt_prepare.unit_hash('a/b.txt') == owt_prepare.unit_hash('a/b.txt') < 1


def _text_folder(folder, n=36):
    """n small, distinct .txt files (20-60 tokens each); returns {file name: text}."""
    texts = {f'notes/n{i:02d}.txt' if i % 3 else f'n{i:02d}.txt':
             f"Note {i}: " + ' '.join(f"word{(i * 7 + j) % 50}" for j in range(10 + i % 25)) for i in range(n)}
    for name, text in texts.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding='utf-8')
    return texts


def _documents(paths):
    """The decoded documents of shards (split on the EOT token) and the number of EOT tokens."""
    tokens = np.concatenate([read_shard(p) for p in paths])
    starts = np.flatnonzero(tokens == EOT).tolist() + [len(tokens)]
    assert starts[0] == 0  # a split starts at a document
    return [enc.decode(tokens[a + 1:b].tolist()) for a, b in zip(starts[:-1], starts[1:])], int((tokens == EOT).sum())


def test_owt_prepare_own_text_is_named_for_the_folder_with_a_val_batch(tmp_path):
    """--input DIR --out_dir data/mytext wrote openwebtext_*.bin, which --dataset=mytext cannot find, and the 0.05%
    val split held one short document. Now the shards are mytext_*, val holds >= --val_tokens tokens of whole
    documents (the lowest hashes), the split is the same on every run, and the last line is the train command."""
    texts = _text_folder(tmp_path / 'src')
    out_dir = tmp_path / 'run1' / 'mytext'
    args = ['--input', str(tmp_path / 'src'), '--val_tokens', '300']
    out = owt_prepare.main(args + ['--out_dir', str(out_dir), '--num_proc', '1'])
    assert sorted(os.listdir(out_dir)) == ['mytext_train_000000.bin', 'mytext_val_000000.bin']
    val, train = shard_paths(str(out_dir), 'val'), shard_paths(str(out_dir), 'train')  # what train.py looks for
    assert sum(read_header(p) for p in val) >= 300 and sum(read_header(p) for p in train) >= 300
    (val_docs, val_eot), (train_docs, train_eot) = _documents(val), _documents(train)
    assert (val_eot, train_eot) == (out['val'][1], out['train'][1]) and val_eot + train_eot == len(texts)
    assert sorted(val_docs + train_docs) == sorted(texts.values())  # every file whole, in exactly one split
    # the rule: val is the lowest hashes (none falls below the default 0.0005 here), and no more than needed
    by_text = {t: owt_prepare.unit_hash(name) for name, t in texts.items()}
    assert min(by_text.values()) > 0.0005
    assert max(by_text[t] for t in val_docs) < min(by_text[t] for t in train_docs)
    top = max(val_docs, key=by_text.get)
    assert sum(1 + len(enc.encode_ordinary(t)) for t in val_docs if t != top) < 300
    # again, from the command line with 2 processes: the same bytes, and the command that trains on them
    out_dir2 = tmp_path / 'run2' / 'mytext'
    p = subprocess.run([sys.executable, os.path.join(HERE, 'data', 'openwebtext', 'prepare.py')] + args +
                       ['--out_dir', str(out_dir2), '--num_proc', '2'], capture_output=True, text=True, check=True)
    for name in os.listdir(out_dir):
        assert (out_dir / name).read_bytes() == (out_dir2 / name).read_bytes(), name
    lines = p.stdout.strip().splitlines()
    assert f"val: {sum(read_header(p) for p in val):,} tokens in {val_eot} documents" in p.stdout
    assert str(out_dir2 / 'mytext_val_000000.bin') in p.stdout
    assert lines[-1] == f"train on it: python train.py --dataset={out_dir2} --out_dir=out-mytext"
    # train.py reads os.path.join(<repo>/data, dataset): an absolute --dataset is the folder itself
    ShardLoader(os.path.join(HERE, 'data', str(out_dir2)), 'val', batch_size=2, block_size=64).next_batch()
    assert owt_prepare.train_command(os.path.join(HERE, 'data', 'mytext')) == "python train.py --dataset=mytext"


def test_owt_prepare_too_small_input_is_one_line(tmp_path):
    _text_folder(tmp_path / 'src', n=5)
    out_dir = tmp_path / 'mytext'
    p = subprocess.run([sys.executable, os.path.join(HERE, 'data', 'openwebtext', 'prepare.py'), '--input',
                        str(tmp_path / 'src'), '--out_dir', str(out_dir), '--num_proc', '1'],
                       capture_output=True, text=True)
    last = p.stderr.strip().splitlines()[-1]  # the lines before it are tqdm's progress
    assert p.returncode == 1 and 'Traceback' not in p.stderr, p.stderr
    assert re.fullmatch(r'prepare\.py: error: --input .*src: \d+ tokens in 5 documents are too few '
                        r'.*--val_tokens=131,072.*', last), p.stderr
    assert not list(out_dir.glob('*.bin'))  # no shards for the loader to half-read
    # val reachable but nothing left for train: the same error, naming what each split would hold
    with pytest.raises(UserError, match=r'too few .*: val would hold 140 and train 0;'):
        owt_prepare.main(['--input', str(tmp_path / 'src'), '--out_dir', str(out_dir), '--num_proc', '1',
                          '--val_tokens', '10', '--val_fraction', '1'])


def test_owt_prepare_hf_path(tmp_path, monkeypatch):
    # the Hugging Face path, offline: load_dataset returns a tiny in-memory dataset
    import datasets
    fake = datasets.Dataset.from_dict({'text': DOCS * 400})
    monkeypatch.setattr(datasets, 'load_dataset', lambda *a, **k: fake)
    monkeypatch.setattr(owt_prepare, 'hub_reachable', lambda: True)  # no network in the tests
    out_dir = str(tmp_path / 'openwebtext')
    out = owt_prepare.main(['--out_dir', out_dir, '--num_proc', '1', '--shard_size', '5000'])
    assert out['val'][1] == 2  # ceil(0.0005 * 2400) documents, as nanoGPT's split gives
    _check_owt_output(out_dir, DOCS * 400)


# -----------------------------------------------------------------------------
# data/pystdlib/prepare.py: its pieces on a fake stdlib (the full run takes seconds, see its readme)

def test_pystdlib_listing_and_tokenize(tmp_path):
    root = tmp_path / 'lib'
    for rel, text in {'a.py': 'import os\n', 'pkg/b.py': 'def f():\n    return 1\n',
                      'pkg/c.py': '# café\nx = 2\n', 'test/test_a.py': 'assert 1\n',
                      'site-packages/x.py': 'y = 1\n', 'notes.txt': 'not python\n',
                      '_sysconfigdata__linux.py': 'build = {}\n'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding='utf-8')
    (root / 'latin1.py').write_bytes('# caf\xe9\n'.encode('latin-1'))  # not UTF-8: skipped
    (root / 'big.py').write_text('#' * (pystdlib_prepare.MAX_BYTES + 1))
    relpaths = pystdlib_prepare.list_files(str(root))
    assert relpaths == ['a.py', 'pkg/b.py', 'pkg/c.py']
    train, val = pystdlib_prepare.split_files(relpaths)
    assert len(val) >= 1 and sorted(train + val) == relpaths
    tokens = pystdlib_prepare.tokenize(str(root / 'pkg' / 'c.py'))
    assert tokens.dtype == np.uint16 and tokens[0] == EOT
    assert enc.decode(tokens[1:].tolist()) == '# café\nx = 2\n'


def test_pystdlib_split_is_stable():
    # crc32 is a fixed function (unlike Python's salted hash()): pinned values keep the split from drifting
    assert pystdlib_prepare.path_hash('os.py') == 823
    assert pystdlib_prepare.path_hash('json/decoder.py') == 175
    paths = [f'm{i}.py' for i in range(1000)]
    train, val = pystdlib_prepare.split_files(paths)
    assert 5 <= len(val) <= 40  # ~2%
    assert pystdlib_prepare.split_files(paths) == (train, val)
    assert pystdlib_prepare.split_files(['x.py', 'y.py'])[1]  # never an empty val


# -----------------------------------------------------------------------------
# bad data and an offline machine give one line naming the file and what to do

def test_loader_refuses_token_ids_past_vocab_up_front(tmp_path):
    """A shard with ids >= the model's vocabulary used to fail as an IndexError deep in the embedding, then when the
    run first reached that shard (iter ~13 of a run: its steps since the last save lost). Now every shard's ids are
    checked when the loader is made, before the first step."""
    data_dir = _make_dataset(tmp_path, [100, 2000])  # shard 1 holds ids 1000..2999
    with pytest.raises(UserError, match=r'toy_train_000001\.bin holds token id 2999, but the model\'s vocab_size is 1000'):
        ShardLoader(data_dir, 'train', batch_size=2, block_size=8, vocab_size=1000)
    ShardLoader(data_dir, 'train', batch_size=2, block_size=8, vocab_size=3000).next_batch()


def test_loader_keeps_reading_its_shards_when_prepare_runs_again(tmp_path):
    """prepare.py run again while a run trained deleted the shards, which the loader reopened by path at the next eval
    (or read the new ones as the same run's). Now each shard is mapped once, and a run reads what it started on."""
    data_dir = _make_dataset(tmp_path, [100, 2000])
    loader = ShardLoader(data_dir, 'train', batch_size=2, block_size=8)
    first = [loader.next_batch() for _ in range(20)]  # into the second shard
    writer = ShardWriter(data_dir, 'toy', 'train', shard_size=50)  # what prepare.py does: old shards deleted...
    writer.add(np.arange(500) % 7)
    writer.close()  # ...and new ones renamed in
    loader.reset()
    again = [loader.next_batch() for _ in range(20)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))


def test_unknown_dataset_lists_what_exists(tmp_path):
    (tmp_path / 'data' / 'pystdlib').mkdir(parents=True)
    (tmp_path / 'data' / 'pystdlib' / 'prepare.py').write_text('')
    with pytest.raises(UserError, match=r"dataset='fineweb': no train shards.*no prepare\.py.*pystdlib.*mqar") as e:
        shard_paths(str(tmp_path / 'data' / 'fineweb'), 'train')
    assert 'data/fineweb/prepare.py' not in str(e.value)


def test_owt_bad_inputs_name_file_and_line(tmp_path):
    src = tmp_path / 'docs.jsonl'
    src.write_text(json.dumps({'text': 'fine'}) + '\n' + json.dumps({'body': 'no text'}) + '\n')
    args = ['--out_dir', str(tmp_path / 'openwebtext'), '--num_proc', '1']
    with pytest.raises(UserError, match=r'docs\.jsonl, line 2: no "text" field'):
        owt_prepare.main(['--input', str(src)] + args)
    src.write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(UserError, match=r'docs\.jsonl, line 2: not valid JSON'):
        owt_prepare.main(['--input', str(src)] + args)
    with pytest.raises(UserError, match=r'--input .*nope\.jsonl: no such file'):
        owt_prepare.main(['--input', str(tmp_path / 'nope.jsonl')] + args)


def test_owt_offline_points_at_input_at_once(tmp_path, monkeypatch):
    """Offline, the Hugging Face path used to retry for ~25 s and end in a traceback without a word about --input."""
    import socket
    import time
    import datasets

    def no_network(*a, **k):
        raise OSError('[Errno -2] Name or service not known')

    def must_not_be_called(*a, **k):
        raise AssertionError('load_dataset was called offline')
    for k in ('HF_HUB_OFFLINE', 'HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy'):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(socket, 'create_connection', no_network)
    monkeypatch.setattr(datasets, 'load_dataset', must_not_be_called)
    t0 = time.time()
    with pytest.raises(UserError, match=r'cannot reach the Hugging Face Hub.*--input'):
        owt_prepare.main(['--out_dir', str(tmp_path / 'openwebtext'), '--num_proc', '1'])
    assert time.time() - t0 < 5


OFFLINE = {'HTTPS_PROXY': 'http://127.0.0.1:9', 'https_proxy': 'http://127.0.0.1:9', 'NO_PROXY': '', 'no_proxy': ''}


def _offline_run(cmd, cache_dir):
    """cmd with an empty tiktoken cache and every download sent to a closed local port: offline for sure."""
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache_dir), **OFFLINE)
    return subprocess.run([sys.executable] + cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=120)


def test_offline_tokenizer_is_one_line_naming_tiktoken_cache_dir(tmp_path):
    p = _offline_run(['data/pystdlib/prepare.py', '--out_dir', str(tmp_path / 'out')], tmp_path)
    assert p.returncode == 1 and p.stderr.count('\n') == 1, p.stderr
    assert 'cannot load the GPT-2 tokenizer' in p.stderr and 'TIKTOKEN_CACHE_DIR' in p.stderr, p.stderr


def test_prepare_help_works_offline(tmp_path):
    for script in ('data/pystdlib/prepare.py', 'data/openwebtext/prepare.py'):
        p = _offline_run([script, '--help'], tmp_path)
        assert p.returncode == 0 and 'usage: prepare.py' in p.stdout and '--out_dir' in p.stdout, p.stderr[-2000:]


def test_shared_tiktoken_cache_layouts(tmp_path):
    """The offline copy is found beside the checkout, inside it, and beside the repository a clone was made from."""
    import shutil
    if shutil.which('git') is None:
        pytest.skip('git is not installed')
    work = tmp_path / 'work'
    (work / 'main').mkdir(parents=True)
    assert shared_tiktoken_cache(str(work / 'main')) is None
    (work / 'shared' / 'tiktoken').mkdir(parents=True)
    assert shared_tiktoken_cache(str(work / 'main')) == str(work / 'shared' / 'tiktoken')      # ../shared/tiktoken
    (work / 'main' / 'shared' / 'tiktoken').mkdir(parents=True)
    shutil.rmtree(work / 'shared')
    assert shared_tiktoken_cache(str(work / 'main')) == str(work / 'main' / 'shared' / 'tiktoken')  # shared/ inside
    shutil.rmtree(work / 'main' / 'shared')
    (work / 'shared' / 'tiktoken').mkdir(parents=True)
    git = ['git', '-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'init.defaultBranch=main']
    subprocess.run(git + ['init', '-q', str(work / 'main')], check=True)
    subprocess.run(git + ['-C', str(work / 'main'), 'commit', '-q', '--allow-empty', '-m', 'x'], check=True)
    (tmp_path / 'elsewhere').mkdir()
    for origin in (str(work / 'main'), '../work/main'):  # absolute and relative clone sources
        clone = tmp_path / 'elsewhere' / f'clone{len(origin)}'
        subprocess.run(git + ['clone', '-q', origin, str(clone)], cwd=tmp_path / 'elsewhere', check=True)
        assert os.path.samefile(shared_tiktoken_cache(str(clone)), work / 'shared' / 'tiktoken'), origin


def test_pystdlib_document_order_is_seeded_and_mixed():
    # the shards' document order: a permutation fixed by the seed (not by the listing's order), and packages mixed
    # (in sorted order a package's files came in a row and every training curve showed a bump per package)
    paths = [f'{pkg}/m{i:03d}.py' for pkg in ('asyncio', 'email', 'json') for i in range(100)]
    order = pystdlib_prepare.shuffled(paths, 1337)
    assert sorted(order) == sorted(paths) and order != sorted(paths)
    assert pystdlib_prepare.shuffled(list(reversed(paths)), 1337) == order
    assert pystdlib_prepare.shuffled(paths, 1) != order
    assert {p.split('/')[0] for p in order[:30]} == {'asyncio', 'email', 'json'}
