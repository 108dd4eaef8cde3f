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
import os
import random
import re
import shutil
import socket
import time

import numpy as np
import torch

from configurator import UserError


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
        text = str(e)
        found = re.search(r'GLOBAL (\S+)', text)  # the function or class the pickle would call
        if found or 'Weights only load failed' in text:
            lines = [line.strip() for line in text.splitlines()[1:] if line.strip() and 'documentation' not in line]
            what = f"it asks to run {found.group(1)}" if found else (lines[-1] if lines else "it holds something else")
            raise CheckpointUnusable(f"refusing to load {path}: a checkpoint must be tensors and plain values, and {what} "
                                     f"(code, which loading would run); nothing was run. Use a checkpoint written by "
                                     f"train.py, or one from a source you trust converted to plain data") from None
        raise CheckpointUnusable(f"cannot read checkpoint {path}: {_cause(e)} "
                                 f"(a truncated or foreign file? train again or pick another out_dir)") from None
    missing = [k for k in NEEDED[need] if not (isinstance(checkpoint, dict) and k in checkpoint)] if need else []
    if missing:
        kind = (f"a dict without {', '.join(missing)}" if isinstance(checkpoint, dict)
                else f"a {type(checkpoint).__name__}, not a dict")
        raise CheckpointUnusable(f"{path} is not a checkpoint of this trainer{' that can be resumed' if need == 'resume' else ''}: "
                                 f"it holds {kind}; use a ckpt.pt written by train.py")
    if need and not (isinstance(checkpoint['model'], dict) and isinstance(checkpoint['model_args'], dict)):
        raise CheckpointUnusable(f"{path} is not a checkpoint of this trainer: its model and model_args must be dicts")
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get('model'), dict)):
        return checkpoint
    checkpoint['model'] = remap_old_keys(checkpoint['model'])
    bad = nonfinite_tensors(checkpoint['model'])
    if bad:
        raise CheckpointUnusable(f"checkpoint {path} holds non-finite weights ({len(bad)} tensors, first: {bad[0]}), "
                                 f"from a run that diverged: use an earlier checkpoint or train again")
    return checkpoint


def build_model(checkpoint, path, model_args):
    """GPT(model_args) with the checkpoint's weights, or one line saying why they do not fit."""
    import dataclasses
    from model import GPT, GPTConfig  # here: a reader of checkpoints need not build models
    unknown = sorted(set(model_args) - {f.name for f in dataclasses.fields(GPTConfig)})
    if unknown:
        raise CheckpointUnusable(f"{path}: model_args has keys this model.py does not know ({', '.join(unknown)}): "
                                 f"a checkpoint of another version or another trainer")
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
    full = os.path.abspath(out_dir)
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
