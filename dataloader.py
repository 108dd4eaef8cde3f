"""
Token shards and the training batch loader: the one place the .bin format is written and read.

The format is llm.c's (so llm.c / modded-nanogpt FineWeb shards train here unchanged):
    header: 256 x int32 little-endian; header[0] = 20240520 (magic), header[1] = 1 (version),
            header[2] = number of tokens
    body:   that many uint16 tokens (GPT-2 BPE fits: vocab 50257 < 65536)
Shards live in data/<dataset>/ and are named <dataset>_<split>_<index:06d>.bin, written by
data/<dataset>/prepare.py. Documents are separated by a leading end-of-text token (50256).

Usage:
    from dataloader import write_shard, read_shard, ShardWriter, ShardLoader
    write_shard('data/foo/foo_train_000000.bin', tokens)    # tokens: ints < 65536
    w = ShardWriter('data/foo', 'foo', 'train')             # or stream documents into ~100M-token shards:
    w.add(doc_tokens); ...; paths = w.close()               #   foo_train_000000.bin, foo_train_000001.bin, ...
    toks = read_shard('data/foo/foo_train_000000.bin')      # np.uint16 array (memory-mapped)
    loader = ShardLoader('data/pystdlib', 'train', batch_size=8, block_size=256,
                         rank=ddp_rank, world_size=ddp_world_size)
    x, y = loader.next_batch()                              # int64 [B, T] each, y = x shifted by one
    ckpt['data'] = loader.state_dict()                      # {'shard': i, 'pos': p}; on resume:
    loader.load_state_dict(ckpt['data'])                    # the next batch is exactly the one that would have come
For evaluation make a ShardLoader on split='val' and call reset() before each eval, so every
eval sees the same tokens.
"""
import glob
import functools
import os
import subprocess

import numpy as np
import torch

from configurator import UserError


def shared_tiktoken_cache(root=os.path.dirname(os.path.abspath(__file__))):
    """A copy of tiktoken's cache kept in a shared/tiktoken folder (how offline machines carry the GPT-2 BPE):
    beside the checkout (../shared), inside it (shared/), or beside the repository this clone was made from
    (<origin>/../shared, as for a fresh clone in /tmp). The first that exists, or None."""
    places = [os.path.join(root, '..', 'shared'), os.path.join(root, 'shared')]
    for i in range(3):
        if i == 2:  # only now ask git where the clone came from
            try:
                origin = subprocess.run(['git', '-C', root, 'config', '--get', 'remote.origin.url'],
                                        capture_output=True, text=True, timeout=10).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                return None
            origin = origin[len('file://'):] if origin.startswith('file://') else origin
            if not origin or '://' in origin or ':' in origin.split('/')[0]:
                return None  # no origin, or a remote one (URL or host:path)
            places.append(os.path.join(root, origin, '..', 'shared'))  # a relative origin is relative to the clone
        path = os.path.join(places[i], 'tiktoken')
        if os.path.isdir(path):
            return os.path.normpath(path)
    return None


@functools.cache  # loaded once per process, on first use (so --help works offline)
def gpt2_encoding():
    """tiktoken's GPT-2 BPE, the tokenizer of every dataset here. tiktoken downloads it once into its
    cache; on an offline machine point TIKTOKEN_CACHE_DIR at a copy. When the variable is unset, a copy in a
    shared/tiktoken folder (see shared_tiktoken_cache) is used. Offline with neither: a UserError saying so."""
    import tiktoken
    if 'TIKTOKEN_CACHE_DIR' not in os.environ:
        shared = shared_tiktoken_cache()
        if shared:
            os.environ['TIKTOKEN_CACHE_DIR'] = shared
    try:
        return tiktoken.get_encoding('gpt2')
    except Exception as e:  # requests' errors offline, or a cache folder that cannot be written
        where = (f"TIKTOKEN_CACHE_DIR={os.environ['TIKTOKEN_CACHE_DIR']} holds no copy of it" if 'TIKTOKEN_CACHE_DIR' in os.environ
                 else "TIKTOKEN_CACHE_DIR is unset and no shared/tiktoken copy was found")
        raise UserError(f"cannot load the GPT-2 tokenizer: tiktoken's download failed ({type(e).__name__}) and {where}; "
                        f"offline, set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cached GPT-2 files (copy it from a "
                        f"machine where tiktoken.get_encoding('gpt2') ran with TIKTOKEN_CACHE_DIR set)") from e


MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4  # 1024


def write_shard(path, tokens):
    """Write tokens (a sequence or array of ints in [0, 65536)) as one llm.c shard, atomically."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError(f"{path}: tokens must be in [0, 65536) to fit uint16, "
                         f"got range [{tokens.min()}, {tokens.max()}]")
    header = np.zeros(HEADER_INTS, dtype='<i4')
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    # write to a temp file in the same directory, then rename: a crash never leaves a half shard
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, 'wb') as f:
        f.write(header.tobytes())
        f.write(tokens.astype('<u2').tobytes())
    os.replace(tmp, path)


class ShardWriter:
    """
    Streams documents' tokens into consecutive shards of shard_size tokens each (the last one
    shorter), so a prepare.py never holds a whole dataset in RAM: one shard-sized uint16 buffer.
    Like llm.c, a document that does not fit is split across two shards.
    """

    def __init__(self, out_dir, dataset, split, shard_size=100_000_000):
        self.pattern = os.path.join(out_dir, f"{dataset}_{split}_{{:06d}}.bin")
        # remove this split's shards from an earlier run: with another shard_size, stale extra
        # shards would otherwise be read as data
        for old in glob.glob(os.path.join(out_dir, f"{dataset}_{split}_*.bin")):
            os.remove(old)
        self.buf = np.empty(shard_size, dtype=np.uint16)  # pages are only touched as it fills
        self.n = 0           # tokens in buf
        self.ntok = 0        # tokens added in total
        self.paths = []      # shards written so far

    def add(self, tokens):
        tokens = np.asarray(tokens)
        self.ntok += len(tokens)
        while len(tokens):
            take = min(len(tokens), len(self.buf) - self.n)
            self.buf[self.n : self.n + take] = tokens[:take]
            self.n, tokens = self.n + take, tokens[take:]
            if self.n == len(self.buf):
                self._flush()

    def _flush(self):
        path = self.pattern.format(len(self.paths))
        write_shard(path, self.buf[:self.n])
        self.paths.append(path)
        self.n = 0

    def close(self):
        """Write the partial last shard; return the list of shard paths."""
        if self.n:
            self._flush()
        return self.paths


def read_header(path):
    """Check a shard's header and size; return its token count. Errors name the file and the problem."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such shard")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise UserError(f"{path}: file is {size} bytes, smaller than the {HEADER_BYTES}-byte header "
                        f"— not an llm.c token shard (or truncated)")
    header = np.fromfile(path, dtype='<i4', count=HEADER_INTS)
    if header[0] != MAGIC:
        raise UserError(f"{path}: bad magic {header[0]} (expected {MAGIC}) — not an llm.c token shard")
    if header[1] != VERSION:
        raise UserError(f"{path}: unsupported version {header[1]} (expected {VERSION}); "
                        f"version 2 shards hold uint32 tokens, this loader reads uint16 only")
    ntok = int(header[2])
    body = size - HEADER_BYTES
    if body != 2 * ntok:
        what = "truncated" if body < 2 * ntok else "trailing bytes"
        raise UserError(f"{path}: {what}: header says {ntok:,} tokens but file holds {body // 2:,} "
                        f"({body:,} bytes after the header); re-run the dataset's prepare.py")
    return ntok


def read_shard(path, mmap=True):
    """Return the tokens of one shard as a np.uint16 array (memory-mapped unless mmap=False)."""
    ntok = read_header(path)
    if ntok == 0:  # np.memmap cannot map zero bytes
        return np.zeros(0, dtype=np.uint16)
    if mmap:
        return np.memmap(path, dtype='<u2', mode='r', offset=HEADER_BYTES, shape=(ntok,))
    with open(path, 'rb') as f:
        f.seek(HEADER_BYTES)
        return np.frombuffer(f.read(), dtype='<u2').astype(np.uint16)


def shard_paths(data_dir, split):
    """Sorted shard files <dataset>_<split>_*.bin of one split; the dataset is data_dir's name."""
    dataset = os.path.basename(os.path.normpath(data_dir))
    paths = sorted(glob.glob(os.path.join(data_dir, f"{dataset}_{split}_*.bin")))
    if not paths and os.path.isfile(os.path.join(data_dir, 'prepare.py')):
        raise UserError(f"no {split} shards ({dataset}_{split}_*.bin) in {data_dir}: "
                        f"run `python data/{dataset}/prepare.py` first")
    if not paths:
        here = sorted(d for d in os.listdir(os.path.dirname(os.path.normpath(data_dir)) or '.')
                      if os.path.isfile(os.path.join(os.path.dirname(os.path.normpath(data_dir)), d, 'prepare.py')))
        raise UserError(f"dataset={dataset!r}: no {split} shards {dataset}_{split}_*.bin in {data_dir} and no prepare.py "
                        f"to make them; datasets with a prepare.py: {', '.join(here) or 'none'}, tasks: mqar, statetrack; or put "
                        f"llm.c shards (e.g. FineWeb's) there under that name")
    return paths


class ShardLoader:
    """
    Sequential batches from a split's shards, in order, wrapping around at the end.
    Each step the global position advances by B*T*world_size; rank r takes the B*T+1 tokens
    starting at pos + r*B*T (the +1 gives the last target). When what is left of a shard cannot
    give every rank a full batch, all ranks move to the next shard together (the tail is skipped).
    """

    def __init__(self, data_dir, split, batch_size, block_size, rank=0, world_size=1, vocab_size=None):
        assert 0 <= rank < world_size, f"rank {rank} not in [0, {world_size})"
        self.B, self.T, self.rank, self.world_size = batch_size, block_size, rank, world_size
        self.paths = shard_paths(data_dir, split)
        # every shard checked up front, so that a bad or too-small shard or a token id the model cannot embed fails now,
        # not hours into a run; and each shard mapped once, for the whole run: a prepare.py run again meanwhile
        # replaces the files (write_shard renames new ones in), while this run keeps reading the shards it started on
        need = batch_size * block_size * world_size + 1
        self.shards = []
        for path in self.paths:
            ntok = read_header(path)
            if ntok < need:
                raise UserError(
                    f"{path}: shard holds {ntok:,} tokens but one step needs batch_size*block_size*"
                    f"world_size+1 = {batch_size}*{block_size}*{world_size}+1 = {need:,}; "
                    f"lower batch_size/block_size or use a bigger dataset")
            self.shards.append(read_shard(path))
            top = int(self.shards[-1].max()) if vocab_size is not None and ntok else -1  # ~0.1 s per 100M tokens
            if vocab_size is not None and top >= vocab_size:
                raise UserError(f"{path} holds token id {top}, but the model's vocab_size is {vocab_size}: set "
                                f"vocab_size above {top} (GPT-2 BPE: 50304), or re-tokenize the data")
        self.reset()

    def reset(self):
        """Back to the first token of the first shard (call before each eval on 'val')."""
        self.load_state_dict({'shard': 0, 'pos': 0})

    def state_dict(self):
        # the position of the *next* batch, identical on all ranks; saved in the checkpoint
        return {'shard': self.shard, 'pos': self.pos}

    def load_state_dict(self, state):
        self.shard, self.pos = int(state['shard']) % len(self.paths), int(state['pos'])
        self.tokens = self.shards[self.shard]

    def next_batch(self):
        B, T = self.B, self.T
        step = B * T * self.world_size
        if self.pos + step + 1 > len(self.tokens):  # not enough left for every rank: next shard
            self.load_state_dict({'shard': self.shard + 1, 'pos': 0})
        start = self.pos + self.rank * B * T
        buf = torch.from_numpy(self.tokens[start : start + B * T + 1].astype(np.int64))
        x = buf[:-1].view(B, T)  # inputs
        y = buf[1:].view(B, T)   # targets: the next token of each input
        self.pos += step
        return x, y
