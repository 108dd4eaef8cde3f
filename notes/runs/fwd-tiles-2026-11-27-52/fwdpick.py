"""Pick TUNING['cumsum'] and TUNING['wy_fwd'] from fwd_tiles.py's output (the sum over its shapes of every forward
kernel's time), only where the patch's GPU tests passed, the candidate's output matched and it beats the default by
more than 2%; write them into kernels.py's TUNING. Usage: fwdpick.py fwdtiles.txt fwdtiles-tests.txt kernels.py"""
import re, sys
out, tests, kpath = sys.argv[1:4]
t = open(tests).read()
if "failed" in t or "error" in t.lower() or "passed" not in t:
    sys.exit(f"fwdpick: the patch's GPU tests did not all pass: {t.strip()[-200:]}")
tot, bad = {}, set()
for line in open(out):
    m = re.match(r"\s+(default|cumsum d\d+ w\d+|wy_fwd split\d+ w\d+)\s+(.*)", line)
    if not m:
        continue
    name, rest = m.groups()
    if "FAILED" in rest:
        bad.add(name); continue
    diff = float(re.search(r"\| ([\d.e+-]+);", rest).group(1))
    if diff > 2e-2:
        bad.add(name)
    tot[name] = tot.get(name, 0.0) + float(re.search(r"every forward kernel ([\d.]+)", rest).group(1))
base = tot.get("default")
if not base:
    sys.exit("fwdpick: no default row")
src = open(kpath).read()
for fam in ("cumsum", "wy_fwd"):
    cands = {n: v for n, v in tot.items() if n.startswith(fam) and n not in bad}
    for n, v in sorted(cands.items(), key=lambda kv: kv[1]):
        print(f"fwdpick {n}: {v:.4f} ms over the shapes ({v / base:.3f} x default's {base:.4f})")
    if not cands:
        continue
    n, v = min(cands.items(), key=lambda kv: kv[1])
    if v > 0.98 * base:
        print(f"fwdpick {fam}: keep the default"); continue
    a, b = map(int, re.findall(r"\d+", n.split(" ", 1)[1]))
    new = f"'cumsum': dict(d={a}, warps={b})" if fam == "cumsum" else f"'wy_fwd': dict(split={a}, warps={b})"
    pat = r"'cumsum': dict\(d=\d+, warps=\d+\)" if fam == "cumsum" else r"'wy_fwd': dict\(split=\d+, warps=\w+\)"
    src, k = re.subn(pat, new, src)
    assert k == 1, (fam, k)
    print(f"fwdpick {fam}: {new}")
open(kpath, "w").write(src)
