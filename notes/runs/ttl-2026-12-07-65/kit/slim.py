# the weights, model_args and settings of each given ckpt.pt (what longctx.py and sample.py read), written in place
# of it: no optimizer state, so that trained needle models fit the call's return and the next call's carry
import sys, torch
for path in sys.argv[1:]:
    c = torch.load(path, map_location='cpu', weights_only=True)
    torch.save({k: c[k] for k in ('model', 'model_args', 'config', 'iter_num', 'best_val_loss') if k in c}, path)
