"""
OpenWebText, or your own text, tokenized with GPT-2 BPE into llm.c shards of ~100M tokens (see dataloader.py).

    python data/openwebtext/prepare.py                                # OpenWebText, downloaded from Hugging Face
    python data/openwebtext/prepare.py --input /path/openwebtext.tar.xz   # the original archive
    python data/openwebtext/prepare.py --input DIR --out_dir data/mytext  # your .txt and/or .jsonl files
    python train.py --dataset=mytext                                  # trains on them

Shards are named for --out_dir's folder, as the loader finds them (data/<dataset>/<dataset>_<split>_*.bin):
the default folder, data/openwebtext, gets openwebtext_val_000000.bin, openwebtext_train_000000.bin, ...;
--out_dir data/mytext gets mytext_val_000000.bin, mytext_train_000000.bin, ... The last line printed is the
train.py command that reads them. Each document is EOT (50256) followed by its tokens.

Needs (approximate, from nanoGPT's published figures for the same data, not measured here):
OpenWebText is ~8M documents, ~9.0B GPT-2 tokens (nanoGPT: train 9,035,582,198 tokens, ~17 GB;
val 4,434,897 tokens), so ~18 GB of shards; the Hugging Face download and its cache take ~54 GB
more (nanoGPT's note for the same dataset); tokenizing takes hours on a few cores. RAM stays
small: one shard-sized uint16 buffer (200 MB) per split plus the worker processes.

Splits:
- Hugging Face: train_test_split(test_size=0.0005, seed=2357, shuffle=True), the same call as
  nanoGPT, so val should hold the same 4,007 documents as nanoGPT's val.bin.
- --input: documents stay whole and are ranked by a stable hash of their name (file path, or path:line
  for .jsonl). Val holds every document whose hash is below --val_fraction, and, when those hold fewer
  than --val_tokens tokens, the lowest-hash other documents until it holds that many (one eval batch;
  a shard shorter than one batch is refused by the loader). So val = the documents with hash <= a cutoff,
  whatever the order of the input. It stays one streamed pass: only the train documents that may still
  be needed for val (the lowest hashes, ~--val_tokens tokens) wait in RAM, the rest go to train at once.
  An input too small for a val of --val_tokens and a train split at least as large is a one-line error.
"""
import argparse
import contextlib
import hashlib
import heapq
import json
import os
import shlex
import socket
import sys
import tarfile
from urllib.parse import urlparse
from multiprocessing import Pool

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))  # repo root
from configurator import UserError, excepthook  # noqa: E402
from dataloader import ShardWriter, gpt2_encoding  # noqa: E402

EOT = 50256   # GPT-2's <|endoftext|>


def tokenize(doc):
    """(name, text) -> (name, uint16 tokens with EOT first). Runs in the worker processes."""
    name, text = doc
    return name, np.array([EOT] + gpt2_encoding().encode_ordinary(text), dtype=np.uint16)


def unit_hash(name):
    """A stable number in [0, 1) from a document's name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha1(name.encode('utf-8')).digest()[:8], 'big') / 2**64


# -----------------------------------------------------------------------------
# local inputs: each yields (name, text), in a fixed order

def docs_from_tar_xz(path):
    """The original openwebtext.tar.xz: members openwebtext/urlsf_subsetXX-YY_data.xz, each a
    tar.xz of .txt files, one document each. Streamed ('r|xz'): nothing is unpacked to disk."""
    with tarfile.open(path, 'r|xz') as outer:
        for member in outer:
            if not (member.isfile() and member.name.endswith('.xz')):
                continue
            with tarfile.open(fileobj=outer.extractfile(member), mode='r|xz') as inner:
                for m in inner:
                    if m.isfile() and m.name.endswith('.txt'):
                        text = inner.extractfile(m).read().decode('utf-8', errors='replace')
                        yield f"{member.name}/{m.name}", text


def docs_from_jsonl(path, name):
    with open(path, encoding='utf-8') as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    text = json.loads(line)['text']
                except (ValueError, KeyError, TypeError) as e:
                    what = 'not valid JSON' if isinstance(e, ValueError) else 'no "text" field'
                    raise UserError(f"{path}, line {i + 1}: {what}; each line of a .jsonl input must be an object "
                                    f"like {{\"text\": \"...\"}}") from None
                if not isinstance(text, str):
                    raise UserError(f"{path}, line {i + 1}: \"text\" is a {type(text).__name__}, not a string")
                yield f"{name}:{i}", text


def docs_from_folder(folder):
    """Every .txt (one document) and .jsonl (one {"text": ...} per line) below folder, sorted."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()  # os.walk's order depends on the file system; sorting makes it fixed
        for fname in sorted(filenames):
            path = os.path.join(dirpath, fname)
            name = os.path.relpath(path, folder).replace(os.sep, '/')
            if fname.endswith('.txt'):
                with open(path, encoding='utf-8', errors='replace') as f:
                    yield name, f.read()
            elif fname.endswith('.jsonl'):
                yield from docs_from_jsonl(path, name)


def local_docs(path):
    if not os.path.exists(path):
        raise UserError(f"--input {path}: no such file or folder")
    if os.path.isdir(path):
        return docs_from_folder(path)
    if path.endswith('.tar.xz'):
        return docs_from_tar_xz(path)
    if path.endswith('.jsonl'):
        return docs_from_jsonl(path, os.path.basename(path))
    raise UserError(f"--input {path}: expected openwebtext.tar.xz, a .jsonl file or a folder")


# -----------------------------------------------------------------------------

def tokenized(pool, docs):
    """Tokens of docs in their order; in parallel when there is a pool."""
    if pool is None:
        return map(tokenize, docs)
    return pool.imap(tokenize, docs, chunksize=16)  # imap keeps the order: shards are reproducible


def prepare_local(args, pool, prefix):
    """Shards of --input's documents; val by the rule of the module docstring (val <= a hash cutoff)."""
    val = ShardWriter(args.out_dir, prefix, 'val', args.shard_size)
    train = ShardWriter(args.out_dir, prefix, 'train', args.shard_size)
    ndocs = {'train': 0, 'val': 0}
    # train documents that val may still need: the lowest hashes seen, a max-heap of (-hash, seq, tokens)
    reserve, reserve_tok = [], 0
    for seq, (name, tokens) in enumerate(tqdm(tokenized(pool, local_docs(args.input)), unit='docs')):
        h = unit_hash(name)
        if h < args.val_fraction:
            val.add(tokens)
            ndocs['val'] += 1
        else:
            heapq.heappush(reserve, (-h, seq, tokens))
            reserve_tok += len(tokens)
        # the highest-hash reserved document goes to train once val can reach --val_tokens without it
        while reserve and val.ntok + reserve_tok - len(reserve[0][2]) >= args.val_tokens:
            tokens = heapq.heappop(reserve)[2]
            reserve_tok -= len(tokens)
            train.add(tokens)
            ndocs['train'] += 1
    for _, _, tokens in sorted(reserve, key=lambda r: -r[0]):  # what is left fills val, lowest hash first
        val.add(tokens)
        ndocs['val'] += 1
    if val.ntok < args.val_tokens or train.ntok < args.val_tokens:
        for path in val.paths + train.paths:  # no half dataset left behind for the loader to read
            os.remove(path)
        raise UserError(f"--input {args.input}: {val.ntok + train.ntok:,} tokens in {sum(ndocs.values()):,} documents "
                        f"are too few for a val split of --val_tokens={args.val_tokens:,} (one eval batch) and a train "
                        f"split at least as large: val would hold {val.ntok:,} and train {train.ntok:,}; add text, or "
                        f"lower --val_tokens (the loader needs batch_size*block_size+1 tokens of your run in val)")
    return {'val': (val, ndocs['val']), 'train': (train, ndocs['train'])}


def hub_reachable(timeout=5):
    """Whether the Hugging Face Hub answers a TCP connect: offline, this fails in seconds, where the hub client
    retries for ~25 s. Behind a proxy, or with HF_HUB_OFFLINE set (the local HF cache), the client decides."""
    if any(os.environ.get(k) for k in ('HF_HUB_OFFLINE', 'HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy')):
        return True
    host = urlparse(os.environ.get('HF_ENDPOINT', 'https://huggingface.co')).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


OFFLINE_HINT = ("download OpenWebText where there is a network and pass it with --input (openwebtext.tar.xz, .jsonl "
                "files or a folder of .txt), or set HF_HUB_OFFLINE=1 if it is already in the Hugging Face cache")


def prepare_hf(args, pool, prefix):
    if not hub_reachable():
        raise UserError(f"cannot reach the Hugging Face Hub to download Skylion007/openwebtext: {OFFLINE_HINT}")
    from datasets import load_dataset  # only this path needs it
    try:
        dataset = load_dataset("Skylion007/openwebtext", split="train", num_proc=args.num_proc)
    except (ConnectionError, OSError) as e:  # datasets' and the hub client's network errors are both OSErrors
        raise UserError(f"downloading Skylion007/openwebtext failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): "
                        f"{OFFLINE_HINT}") from e
    split_dataset = dataset.train_test_split(test_size=args.val_fraction, seed=2357, shuffle=True)
    split_dataset['val'] = split_dataset.pop('test')  # rename, as nanoGPT does
    out = {}
    for split in ['val', 'train']:
        ds = split_dataset[split]
        writer = ShardWriter(args.out_dir, prefix, split, args.shard_size)
        # ds.iter reads the Arrow files in batches: the texts are never all in RAM at once
        docs = ((None, text) for batch in ds.iter(batch_size=1000) for text in batch['text'])
        for _, tokens in tqdm(tokenized(pool, docs), total=len(ds), desc=split, unit='docs'):
            writer.add(tokens)
        out[split] = (writer, len(ds))
    return out


DATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's data/, where train.py looks


def train_command(out_dir):
    """The train.py command that reads the shards in out_dir. train.py reads data/<dataset> of the repository;
    an absolute --dataset is that folder itself (os.path.join keeps it), and its default out_dir would hold
    the whole path, so it gets a short one."""
    out_dir = os.path.abspath(out_dir)
    name = os.path.basename(out_dir)
    if os.path.realpath(os.path.dirname(out_dir)) == os.path.realpath(DATA):
        return f"python train.py --dataset={name}"
    return f"python train.py --dataset={shlex.quote(out_dir)} --out_dir={shlex.quote('out-' + name)}"


def main(argv=None):
    parser = argparse.ArgumentParser(description="Tokenize OpenWebText or your own text (GPT-2 BPE) into llm.c shards.")
    parser.add_argument('--input', default=None, help='local openwebtext.tar.xz, .jsonl or folder of .txt/.jsonl; '
                        'default: download OpenWebText from HF')
    parser.add_argument('--out_dir', default=os.path.join(DATA, 'openwebtext'),
                        help="where the shards go, named for this folder: data/mytext -> mytext_train_000000.bin, "
                             "for train.py --dataset=mytext (default: data/openwebtext)")
    parser.add_argument('--shard_size', type=int, default=100_000_000, help='tokens per shard; 1e8 tokens = 200 MB')
    parser.add_argument('--num_proc', type=int, default=max(1, os.cpu_count() // 2), help='tokenizer processes')
    parser.add_argument('--val_fraction', type=float, default=0.0005,
                        help="share of documents in val (0.05%%, nanoGPT's); with --input: those whose name hashes "
                             "below it")
    parser.add_argument('--val_tokens', type=int, default=131_072,
                        help='with --input: the fewest tokens in val, filled up with the lowest-hash documents; the '
                             'loader takes no less than one batch (batch_size*block_size*GPUs+1 tokens), and 131,072 '
                             'covers config/owt.py (12*1,024) on up to 8 GPUs (98,305)')
    args = parser.parse_args(argv)
    gpt2_encoding()  # fail here, before any work, when the tokenizer cannot be loaded; forked workers inherit it

    prefix = os.path.basename(os.path.abspath(args.out_dir))  # the loader finds <folder>_<split>_*.bin by its folder
    os.makedirs(args.out_dir, exist_ok=True)
    with Pool(args.num_proc) if args.num_proc > 1 else contextlib.nullcontext() as pool:  # pool is None for 1
        out = prepare_local(args, pool, prefix) if args.input else prepare_hf(args, pool, prefix)
    for split, (writer, ndocs) in out.items():
        for path in writer.close():
            print(f"wrote {path}")
    for split, (writer, ndocs) in out.items():
        print(f"{split}: {writer.ntok:,} tokens in {ndocs:,} documents, {len(writer.paths)} shard(s)")
    print(f"train on it: {train_command(args.out_dir)}")
    return out


if __name__ == '__main__':
    sys.excepthook = excepthook  # a UserError (no tokenizer or no network offline, a bad --input) is one line
    main()
