# Host cost of FSDP2 (one unit, as train.py) against DDP at a simulated world size, collectives no-ops ("fake"
# backend, one process), the hybrid's 12 blocks at width 64 (compute small), eager CPU, one thread.
# Usage: python scratch/fsdp_fake.py {ddp|fsdp} WORLD
import sys, time, statistics, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
sys.path.insert(0, '.')
from model import GPT, GPTConfig
mode, world = sys.argv[1], int(sys.argv[2])
dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=world)
torch.manual_seed(0); torch.set_num_threads(1)
cfg = GPTConfig(n_layer=12, n_head=2, n_embd=64, head_dim=32, block_size=32, vocab_size=512, mixer='kda*3,softmax')
model = GPT(cfg)
if mode == 'fsdp':
    from torch.distributed.fsdp import fully_shard
    fully_shard(model)
    raw = model
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cpu')
    dt = [p for g in opt.param_groups for p in g['params']]
    with torch.no_grad():
        opt = torch.optim.AdamW([dict(g, params=[p.to_local() for p in g['params']]) for g in opt.param_groups])
    shards = [p for g in opt.param_groups for p in g['params']]
else:  # no wrapper: the host work of the model itself (DDP's hooks do not run with the fake backend)
    raw = model
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cpu')
x = torch.randint(0, 512, (2, 32)); y = torch.randint(0, 512, (2, 32))
ph = {k: [] for k in ('fwd0', 'bwd0', 'fwd1', 'bwd1', 'handover', 'clip', 'opt', 'prefetch')}
for step in range(25):
    rec = {}
    for micro in range(2):
        last = micro == 1
        if mode == 'fsdp':
            raw.set_requires_gradient_sync(last); raw.set_reshard_after_backward(last)
        t = time.perf_counter(); _, loss = model(x, y); t1 = time.perf_counter(); loss.backward(); t2 = time.perf_counter()
        rec[f'fwd{micro}'], rec[f'bwd{micro}'] = t1 - t, t2 - t1
    t = time.perf_counter()
    if mode == 'fsdp':
        with torch.no_grad():
            for p, sh in zip(dt, shards):
                sh.grad = None if p.grad is None else p.grad.to_local()
    t1 = time.perf_counter()
    if mode == 'fsdp':
        with torch.no_grad():
            n = torch.nn.utils.get_total_norm([s.grad for s in shards if s.grad is not None]) ** 2
            dist.all_reduce(n); n = n.sqrt()
            torch.nn.utils.clip_grads_with_norm_(shards, 1.0, n)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    t2 = time.perf_counter()
    opt.step(); opt.zero_grad(set_to_none=True)
    if mode == 'fsdp':
        raw.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    if mode == 'fsdp' and 'prefetch' in sys.argv:
        raw.unshard(async_op=True)
    t4 = time.perf_counter()
    rec.update(handover=t1 - t, clip=t2 - t1, opt=t3 - t2, prefetch=t4 - t3)
    if step >= 5:
        for k, v in rec.items():
            ph[k].append(v)
tot = statistics.median([sum(ph[k][i] for k in ph) for i in range(len(ph['opt']))])
print(f"{' '.join(sys.argv[1:]):18s} step {tot * 1e3:6.1f} ms | " + ' '.join(f"{k} {statistics.median(v) * 1e3:.1f}" for k, v in ph.items()))
