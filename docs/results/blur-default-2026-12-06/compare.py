"""compare.py A B TASK: paired comparison of two sets of runs, by run-name prefix, over the
per_problem.json of this directory, ../blurred-beacons-2026-12-06 and
../beacon-radius-fresh-2026-12-06 (the same script as ../blurred-beacons-2026-12-06's).

    python3 compare.py b158 bl158 pe   # 158 / 32, defaults vs blur_speed=0.02, ten splits"""
import json
import math
import os
import sys
from math import comb

here = os.path.dirname(os.path.abspath(__file__))
runs = {}
for p in ("per_problem.json", "../blurred-beacons-2026-12-06/per_problem.json",
          "../beacon-radius-fresh-2026-12-06/per_problem.json"):
    runs.update(json.load(open(os.path.join(here, p))))


def mcnemar(b, c):
    n, k = b + c, min(b, c)
    return 1.0 if n == 0 else min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)


def wilson(k, n, z=1.96):
    p, d = k / n, 1 + z * z / n
    c, h = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (c - h) / d, (c + h) / d


a, b, task = sys.argv[1:4]
lost = gained = n = k0 = k1 = 0
for name in sorted(r for r in runs if r.startswith(f"{a}_{task}-")):
    c0, c1 = runs[name]["correct"], runs[f"{b}_" + name[len(a) + 1:]]["correct"]
    bl = sum(x == "1" and y == "0" for x, y in zip(c0, c1))
    gn = sum(x == "0" and y == "1" for x, y in zip(c0, c1))
    print("  %s %s %.3f %s %.3f lost %d gained %d" % (
        name[len(a) + 1:], a, c0.count("1") / len(c0), b, c1.count("1") / len(c1), bl, gn))
    lost, gained, n = lost + bl, gained + gn, n + len(c0)
    k0, k1 = k0 + c0.count("1"), k1 + c1.count("1")
d = (k1 - k0) / n
se = math.sqrt((lost + gained) - (gained - lost) ** 2 / n) / n
print("%s n=%d %s %.4f [%.3f, %.3f] %s %.4f [%.3f, %.3f] diff %+.2f pt [%+.2f, %+.2f] "
      "lost %d gained %d McNemar p=%.2g" % (
          task, n, a, k0 / n, *wilson(k0, n), b, k1 / n, *wilson(k1, n), 100 * d,
          100 * (d - 1.96 * se), 100 * (d + 1.96 * se), lost, gained, mcnemar(lost, gained)))
