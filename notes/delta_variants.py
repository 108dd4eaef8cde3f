"""
The delta-rule kernels with fp32 (tf32) dot operands, as they run by default, against the same kernels with bf16
dot operands (kernels._dot's PREC='bf16'): errors against the fp64 recurrence (test_kernels' metric and tolerances)
and forward / forward+backward time per kernel variant, in one GPU process.

$ python notes/delta_variants.py     # errors at B2 T1000/4096 H2 D128, times at B8 T4096 H16 D128, then fla's errors
"""
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import kernels  # noqa: E402
import test_kernels as tk  # noqa: E402

meta = kernels._meta


def use(prec):
    """bf16 inputs run with dot operands `prec` ('tf32': today's default, 'bf16')."""
    def patched(q, k, v):
        m = meta(q, k, v)
        return m if q.dtype == torch.float32 else m[:-1] + (prec,)
    kernels._meta = patched


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    for prec in ("tf32", "bf16"):
        use(prec)
        for T in (1000, 4096):
            for gate, st in (("none", "-"), ("gdn", "mild"), ("gdn", "strong"), ("kda", "mild"), ("kda", "strong")):
                try:
                    tk.triton_check(2, T, 2, 128, 128, gate, st, torch.bfloat16)
                except AssertionError as e:
                    print(f"  {prec}: over tolerance: {e}")
    print()
    for variant in ("deltanet", "gdn", "kda"):
        x = bench.inputs(8, 4096, 16, 128, variant)
        leaves = ["q", "k", "v", "beta"] + (["g"] if x["g"] is not None else [])
        for prec in ("tf32", "bf16"):
            use(prec)
            f, fb, peak = bench.measure(lambda y: bench.run_chunk("ours", variant, y), x, leaves)
            print(f"{variant} B8 T4096 H16 D128 dots {prec}: fwd {f:.3f} ms, fwd+bwd {fb:.3f} ms, peak {peak:.0f} MiB",
                  flush=True)
    kernels._meta = meta
    fla, version = bench.load_fla()  # the peer's error on the same inputs, by the same metric
    for gate, st, variant in (("none", "-", "deltanet"), ("kda", "mild", "kda"), ("kda", "strong", "kda")):
        chunk = fla[variant][0]
        if isinstance(chunk, str):
            print(f"fla {version} {variant}: {chunk}")
            continue

        def fla_fn(q, k, v, beta, g=None, initial_state=None, output_final_state=False, chunk=chunk):
            args = (q, k, v, beta) if g is None else (q, k, v, g, beta)
            return chunk(*args, initial_state=initial_state, output_final_state=output_final_state)
        for T in (1000, 4096):
            x = tk.triton_inputs(2, T, 2, 128, 128, gate, st, torch.bfloat16)
            try:
                tk.compare_to_reference(fla_fn, kernels.delta_rule_recurrent, x, torch.bfloat16,
                                        label=f"fla {version} T={T} {gate}/{st}")
            except Exception as e:  # noqa: BLE001
                print(f"  fla: {str(e)[:200]}")
