"""
Checkpoint files: what train.py writes and what train.py (resume) and sample.py read.

    from checkpoint import save_checkpoint, load_checkpoint
    save_checkpoint(ckpt, 'out/ckpt.pt', best='out/best.pt')   # atomic; best.pt keeps this one
    ckpt = load_checkpoint('out/ckpt.pt', map_location='cpu')  # errors name the file and what to do

A checkpoint is a dict: model (the uncompiled model's state_dict), optimizer, model_args, iter_num, val_loss,
best_val_loss, config, and for an exact resume scaler, train_loader (every rank's data position) and rng (every
rank's torch/cuda/numpy/python RNG states). The rules, each tested in test_train.py / test_model.py:
- a save writes a temp file and renames it, so an interrupted save leaves the previous checkpoint intact;
- non-finite weights are never saved and never loaded, so a diverged run cannot replace the last good state;
- checkpoints written before the per-layer mixer was named `mixer` (keys `transformer.h.N.attn.*`) load unchanged.
"""
import os
import re
import shutil

import torch

from configurator import UserError


class CheckpointMissing(UserError, FileNotFoundError):
    pass


class CheckpointUnusable(UserError, RuntimeError):
    pass


def nonfinite_tensors(state_dict):
    """Names of the tensors in state_dict holding a NaN or an infinity."""
    return [k for k, v in state_dict.items() if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]


def save_checkpoint(checkpoint, path, best=None):
    """Write checkpoint to path atomically; refuse non-finite weights. best: a second name that keeps this
    checkpoint after later saves replace path (a hard link, so no second write; a copy where links fail)."""
    bad = nonfinite_tensors(checkpoint.get('model', {}))
    if bad:
        raise CheckpointUnusable(f"not saving {path}: {len(bad)} weight tensors are non-finite (first: {bad[0]}); "
                                 f"the previous checkpoint there is kept")
    tmp = path + '.tmp'
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one, never half
    if best is not None:
        tmp = best + '.tmp'
        if os.path.lexists(tmp):
            os.remove(tmp)
        try:
            os.link(path, tmp)  # the next save replaces path with a new file: this one lives on as best
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, best)


def remap_old_keys(state_dict):
    """The per-layer mixer was stored as `attn` (nanoGPT's name) before it was renamed `mixer`: map old keys."""
    return {re.sub(r'^(transformer\.h\.\d+\.)attn\.', r'\1mixer.', k): v for k, v in state_dict.items()}


def load_checkpoint(path, map_location='cpu'):
    if not os.path.isfile(path):
        raise CheckpointMissing(f"no checkpoint at {path} (train one first, or check out_dir)")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise CheckpointUnusable(f"cannot read checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                                 f"(a truncated or foreign file? train again or pick another out_dir)") from e
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get('model'), dict):
        checkpoint['model'] = remap_old_keys(checkpoint['model'])
    bad = nonfinite_tensors(checkpoint.get('model', {})) if isinstance(checkpoint, dict) else []
    if bad:
        raise CheckpointUnusable(f"checkpoint {path} holds non-finite weights ({len(bad)} tensors, first: {bad[0]}), "
                                 f"from a run that diverged: use an earlier checkpoint or train again")
    return checkpoint
