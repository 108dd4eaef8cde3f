"""
Compile flash-linear-attention's chunk kernels (fwd + bwd) at bench.py's shapes without timing anything, so that a
device call can fill Triton's disk cache while the GPU tests compile ours, then time both with a warm cache.

$ PYTHONPATH=/tmp/site python notes/fla_warm.py            # every variant
$ PYTHONPATH=/tmp/site python notes/fla_warm.py kda        # one (run one process per variant to compile in parallel)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402

fla, version = bench.load_fla()
print("fla", version)
for B, T, H, D in bench.SHAPES:
    for variant in sys.argv[1:] or bench.VARIANTS:
        fn = fla[variant][0]
        if isinstance(fn, str):
            print(variant, fn)
            continue
        x = bench.inputs(B, T, H, D, variant)
        x = {n: (t.requires_grad_() if t is not None else t) for n, t in x.items()}
        try:
            bench.run_chunk(fn, variant, x).sum().backward()
            torch.cuda.synchronize()
            print("warm", variant, (B, T, H, D), flush=True)
        except Exception as e:  # noqa: BLE001 (fla's GDN refuses on Triton < 3.7.1 on Hopper)
            print(variant, (B, T, H, D), bench.first_line(e), flush=True)
