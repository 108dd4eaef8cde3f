"""
Compare the per-iteration training losses of several train.py runs (their log.txt files): the loss at a few
iterations, and for each run against the first its mean and largest |difference| over all iterations and over the
last 50 (issue 15's check that a change keeps the loss curve within bf16 noise: same seed and data, before / after,
and a second run of the same code in another numerics, e.g. --compile=False, as the noise yardstick).

$ python notes/loss_curves.py before/log.txt after/log.txt after-eager/log.txt
"""
import re
import statistics
import sys


def losses(path):
    """{iteration: training loss} from train.py's 'iter N: loss X, ...' lines."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"iter (\d+): loss ([0-9.]+)", line)
            if m:
                out[int(m.group(1))] = float(m.group(2))
    return out


def main(paths):
    runs = [losses(p) for p in paths]
    common = sorted(set.intersection(*(set(r) for r in runs)))
    if not common:
        sys.exit("no common iterations in these logs")
    shown = sorted({common[0], *common[len(common) // 4::len(common) // 4], common[-1]})
    print("iteration | " + " | ".join(paths))
    for i in shown:
        print(f"{i:9d} | " + " | ".join(f"{r[i]:.4f}" for r in runs))
    last = common[-50:]
    for p, r in zip(paths[1:], runs[1:]):
        d = [abs(r[i] - runs[0][i]) for i in common]
        dl = [abs(r[i] - runs[0][i]) for i in last]
        print(f"{p} - {paths[0]}: mean |diff| {statistics.mean(d):.4f}, max {max(d):.4f} over {len(common)} "
              f"iterations; last {len(last)}: mean {statistics.mean(dl):.4f}, max {max(dl):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
