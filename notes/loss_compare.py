"""Compare train.py loss curves (issue 41 point 5, the 200-step loss check): each pair of logs' mean and largest
|difference| over the iterations both have, and over their last 50, and each log's mean loss over the last 50 iterations
that every log has.

    python notes/loss_compare.py notes/runs/losscheck-2026-11-26-{before,after,eager}.txt new.txt [...]
"""
import itertools
import re
import sys
from pathlib import Path


def losses(path):
    """{iteration: loss} from train.py's 'iter N: loss X' lines ('iter N/M: loss X' since the step counter was added)."""
    return {int(i): float(x) for i, x in
            re.findall(r"^iter (\d+)(?:/\d+)?: loss ([\d.]+|nan|inf)", Path(path).read_text(), re.M)}


def main(paths):
    runs = {Path(p).stem: losses(p) for p in paths}
    for name, r in runs.items():
        if not r:
            print(f"{name}: no 'iter N: loss X' lines: is it a train.py log?")
            sys.exit(1)
    common = sorted(set.intersection(*(set(r) for r in runs.values())))[-50:]  # the same window for every log
    for name, r in runs.items():
        window = f", mean of iterations {common[0]}-{common[-1]} {sum(r[i] for i in common) / len(common):.4f}" if common else ""
        print(f"{name}: iterations {min(r)}-{max(r)}, loss at first / last {r[min(r)]:.4f} / {r[max(r)]:.4f}{window}")
    for (a, ra), (b, rb) in itertools.combinations(runs.items(), 2):
        both = sorted(set(ra) & set(rb))
        if not both:
            print(f"{b} - {a}: no common iterations")
            continue
        d = [abs(ra[i] - rb[i]) for i in both]
        tail = d[-50:]
        print(f"{b} - {a}: mean |difference| {sum(d) / len(d):.4f} (largest {max(d):.4f}) over {len(d)} iterations, "
              f"{sum(tail) / len(tail):.4f} over the last {len(tail)}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:])
