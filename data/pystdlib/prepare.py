"""
The offline default dataset: the Python standard library's own .py source files, tokenized with
GPT-2 BPE. Every Python install carries it, so the quick start and the tests need no download.

    python data/pystdlib/prepare.py                  # from the repo root; ~10 s on 2 cores

Writes pystdlib_train_000000.bin and pystdlib_val_000000.bin (llm.c shards, see dataloader.py)
next to this file. One document per file, EOT (50256) prepended, in a seeded shuffled order (--seed):
in sorted path order, whole packages (asyncio, email, ...) came in a row and every training curve
showed their bumps. A file goes to val when a stable hash of its path relative to the stdlib root
falls in the lowest ~2%, so the split does not depend on the machine, the order or the seed.
Excluded: site-packages (not the stdlib), test suites (directories test/, tests/, idle_test/:
large and full of deliberately odd code and data), build-specific files (_sysconfigdata_*,
config-*/), files over 500 KB (pydoc_data/topics.py, a generated text blob) and files that are
not valid UTF-8. The token counts therefore differ a little between Python versions; readme.md
has the measured ones.
"""
import argparse
import os
import sys
import sysconfig
import zlib
from multiprocessing import Pool

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))  # repo root
from configurator import excepthook  # noqa: E402
from dataloader import ShardWriter, gpt2_encoding  # noqa: E402

EXCLUDE_DIRS = {'site-packages', 'test', 'tests', 'idle_test', '__pycache__'}
MAX_BYTES = 500_000
VAL_PERMILLE = 20  # ~2% of files go to val
EOT = 50256        # GPT-2's <|endoftext|>


def list_files(root):
    """Sorted relative paths (with '/') of the .py files of the stdlib at root, minus the exclusions."""
    relpaths = []
    for dirpath, dirnames, filenames in os.walk(root):
        # prune in place so os.walk does not descend into excluded folders
        dirnames[:] = [d for d in dirnames if d not in EXCLUDE_DIRS and not d.startswith('config-')]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not name.endswith('.py') or name.startswith('_sysconfigdata_'):
                continue
            if os.path.getsize(path) > MAX_BYTES:
                continue
            try:
                with open(path, 'rb') as f:
                    f.read().decode('utf-8')
            except UnicodeDecodeError:
                continue
            relpaths.append(os.path.relpath(path, root).replace(os.sep, '/'))
    return sorted(relpaths)


def path_hash(relpath):
    """Stable across runs and machines: crc32, not Python's hash() (salted per process)."""
    return zlib.crc32(relpath.encode('utf-8')) % 1000


def split_files(relpaths):
    """(train, val) lists of relative paths; val is never empty when there are >= 2 files."""
    val = [p for p in relpaths if path_hash(p) < VAL_PERMILLE]
    if not val and len(relpaths) >= 2:  # tiny inputs: take the file with the smallest hash
        val = [min(relpaths, key=path_hash)]
    train = [p for p in relpaths if p not in val]
    return train, val


def shuffled(relpaths, seed):
    """relpaths in a seeded random order, the same on every machine (numpy's PCG64 from the sorted list)."""
    order = np.random.default_rng(seed).permutation(len(relpaths))
    return [sorted(relpaths)[i] for i in order]


def tokenize(path):
    """One document: EOT then the GPT-2 BPE tokens of the file's text, as uint16."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    return np.array([EOT] + gpt2_encoding().encode_ordinary(text), dtype=np.uint16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out_dir', default=os.path.dirname(os.path.abspath(__file__)), help='where the shards go')
    parser.add_argument('--num_proc', type=int, default=2, help='tokenizer processes')
    parser.add_argument('--seed', type=int, default=1337, help='seed of the document order')
    args = parser.parse_args()
    gpt2_encoding()  # fail here, before any work, when the tokenizer cannot be loaded; forked workers inherit it

    root = sysconfig.get_paths()['stdlib']
    relpaths = list_files(root)
    train, val = (shuffled(files, args.seed) for files in split_files(relpaths))
    print(f"Python {sys.version.split()[0]} stdlib at {root}: {len(relpaths):,} files "
          f"({len(train):,} train, {len(val):,} val)")
    os.makedirs(args.out_dir, exist_ok=True)
    with Pool(args.num_proc) as pool:
        for split, files in [('val', val), ('train', train)]:
            writer = ShardWriter(args.out_dir, 'pystdlib', split)
            paths = [os.path.join(root, p) for p in files]
            # imap keeps the (seeded) order, so the shards are the same on every run
            for tokens in tqdm(pool.imap(tokenize, paths, chunksize=8), total=len(paths), desc=split, unit='files'):
                writer.add(tokens)
            for path in writer.close():
                print(f"wrote {path}")
            print(f"{split}: {writer.ntok:,} tokens in {len(files):,} documents")


if __name__ == '__main__':
    sys.excepthook = excepthook  # a UserError (e.g. no tokenizer offline) is one line, not a traceback
    main()
