"""Median ms per step of each run in each call of session (u): a log's segments start at '=== <date time>' headers
(one per start or resume); a call is known by its start time. The first 2 logged steps of a segment (compile, CUDA
graph capture) are left out."""
import glob, re, statistics, sys
calls = [('u1', '02:29', '02:38:50'), ('u2', '02:38:50', '02:48:20'), ('u3', '02:48:20', '02:57')]  # v1 began 02:58
rows = {}
# $ python notes/runs/recall-grid-2026-11-25-u/ms_per_call.py   (from the repository root)
for f in sorted(glob.glob('notes/runs/mqar-grid-2026-11-25-s/grid/*/log.txt')
                + glob.glob('notes/runs/recall-grid-2026-11-25-t/statetrack/*/log.txt')):
    task, name = ('mqar' if '/mqar-grid' in f else 'statetrack'), f.split('/')[-2]
    for seg in re.split(r'^(?==== )', open(f).read(), flags=re.M):
        m = re.match(r'=== 2026-11-25 (\d\d:\d\d:\d\d)', seg)
        if not m or m.group(1) < '02:29':
            continue
        call = next((c for c, a, b in calls if a <= m.group(1) < b), None)
        if call is None:  # a later call (v1-v4)
            continue
        t = [float(x) for x in re.findall(r'^iter \d+: .*?time ([\d.]+)ms', seg, re.M)[2:]]
        if len(t) >= 5:
            rows.setdefault((task, name), {})[call] = (statistics.median(t), len(t))
for task in ('mqar', 'statetrack'):
    both = [(k, v) for k, v in rows.items() if k[0] == task]
    for c in ('u1', 'u2', 'u3'):
        meds = [v[c][0] for k, v in both if c in v]
        if meds:
            print(f"{task} {c}: {len(meds)} runs, median of their medians {statistics.median(meds):.1f} ms/step, "
                  f"range {min(meds):.1f}-{max(meds):.1f}")
    pair = [(v['u1'][0], v['u2'][0]) for k, v in both if 'u1' in v and 'u2' in v]
    if pair:
        r = [a / b for a, b in pair]
        print(f"{task}: {len(pair)} runs in both u1 and u2: u1/u2 ms ratio median {statistics.median(r):.2f}, "
              f"range {min(r):.2f}-{max(r):.2f}")
# v1-v4: state tracking's batch-256 runs, per width (every segment of each run, the first 2 logged steps left out)
for w in ('w256', 'w128'):
    meds = []
    for f in glob.glob(f'notes/runs/recall-grid-2026-11-25-t/statetrack/*_{w}_*_bs256/log.txt'):
        for seg in re.split(r'^(?==== )', open(f).read(), flags=re.M):
            t = [float(x) for x in re.findall(r'^iter \d+: .*?time ([\d.]+)ms', seg, re.M)[2:]]
            if len(t) >= 5:
                meds.append(statistics.median(t))
    print(f"statetrack bs256 {w}: {len(meds)} run segments, median of their medians {statistics.median(meds):.1f} "
          f"ms/step, range {min(meds):.1f}-{max(meds):.1f}")
