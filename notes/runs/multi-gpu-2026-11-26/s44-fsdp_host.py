# Host-side cost of FSDP2 against DDP per phase (forward, backward, clip, optimizer) for the hybrid's block structure
# at a tiny width (compute negligible): 2 gloo ranks on CPU, eager. Usage: torchrun --nproc_per_node=2 scratch/fsdp_host.py
import os, sys, time, math, torch, torch.distributed as dist
sys.path.insert(0, '.')
from model import GPT, GPTConfig
dist.init_process_group('gloo')
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
mode = sys.argv[1]
cfg = GPTConfig(n_layer=12, n_head=2, n_embd=64, head_dim=32, block_size=32, vocab_size=512, mixer='kda*3,softmax')
model = GPT(cfg)
if mode == 'fsdp':
    from torch.distributed.fsdp import fully_shard
    kw = dict(reshard_after_forward=('noreshard' not in sys.argv))
    if 'root' not in sys.argv:
        for b in model.transformer.h:
            fully_shard(b, **kw)
    fully_shard(model, **kw)
    if 'keep' in sys.argv:
        model.set_reshard_after_backward(False)
    raw = model
else:
    from torch.nn.parallel import DistributedDataParallel as DDP
    raw = model
    model = DDP(model)
opt = raw.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cpu')
if 'fused' in sys.argv:
    opt = torch.optim.AdamW(opt.param_groups, lr=1e-4, fused=True)
x = torch.randint(0, 512, (2, 32)); y = torch.randint(0, 512, (2, 32))
ph = dict(fwd=0., bwd=0., clip=0., opt=0.)
for step in range(12):
    for micro in range(2):
        last = micro == 1
        if mode == 'fsdp':
            raw.set_requires_gradient_sync(last)
            if 'keep' in sys.argv:
                raw.set_reshard_after_backward(last)
        else:
            model.require_backward_grad_sync = last
        t = time.perf_counter(); _, loss = model(x, y); t1 = time.perf_counter()
        loss.backward(); t2 = time.perf_counter()
        if step >= 2:
            ph['fwd'] += t1 - t; ph['bwd'] += t2 - t1
    t = time.perf_counter(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); t1 = time.perf_counter()
    opt.step(); opt.zero_grad(set_to_none=True); t2 = time.perf_counter()
    if step >= 2:
        ph['clip'] += t1 - t; ph['opt'] += t2 - t1
if rank == 0:
    print(' '.join(sys.argv[1:]), ' '.join(f"{k} {v / 10 * 1e3:.1f} ms" for k, v in ph.items()))
dist.destroy_process_group()
