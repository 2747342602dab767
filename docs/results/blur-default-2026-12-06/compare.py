"""compare.py A B TASK: paired comparison of two sets of runs, by run-name prefix, over the
per_problem.json of this directory, ../blurred-beacons-2026-12-06 and
../beacon-radius-fresh-2026-12-06, with the statistics of `beaconkv compare`
(beaconkv/stats.py).

    python3 compare.py b158 bl158 pe   # 158 / 32, defaults vs blur_speed=0.02, ten splits
    python3 compare.py d96 l3 pe       # 96 / 32, defaults vs blurred rows in layer 3 only"""
import json
import os
import sys

from beaconkv.stats import paired, wilson

here = os.path.dirname(os.path.abspath(__file__))
runs = {}
for p in ("per_problem.json", "../blurred-beacons-2026-12-06/per_problem.json",
          "../beacon-radius-fresh-2026-12-06/per_problem.json"):
    runs.update(json.load(open(os.path.join(here, p))))

a, b, task = sys.argv[1:4]
all_a, all_b = [], []
for name in sorted(r for r in runs if r.startswith(f"{a}_{task}-")):
    if f"{b}_" + name[len(a) + 1:] not in runs:  # splits only `a` ran on
        continue
    c0 = [x == "1" for x in runs[name]["correct"]]
    c1 = [x == "1" for x in runs[f"{b}_" + name[len(a) + 1:]]["correct"]]
    one = paired(c0, c1)
    print("  %s %s %.3f %s %.3f lost %d gained %d" % (
        name[len(a) + 1:], a, one.correct_a / one.n, b, one.correct_b / one.n, one.lost,
        one.gained))
    all_a, all_b = all_a + c0, all_b + c1
c = paired(all_a, all_b)
lo, hi = c.difference_interval()
print("%s n=%d %s %.4f [%.3f, %.3f] %s %.4f [%.3f, %.3f] diff %+.2f pt [%+.2f, %+.2f] "
      "lost %d gained %d McNemar p=%.2g" % (
          task, c.n, a, c.correct_a / c.n, *wilson(c.correct_a / c.n, c.n), b,
          c.correct_b / c.n, *wilson(c.correct_b / c.n, c.n), 100 * c.difference, 100 * lo,
          100 * hi, c.lost, c.gained, c.p_value))
