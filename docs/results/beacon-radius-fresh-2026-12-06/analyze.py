"""analyze.py TASK...: paired comparison of radius 0 (r0_) and 0.1 (r1_) from per_problem.json.

TASK is the run-name prefix: pe (plan-exec 96 / 32) or du (def-use 96 / 16)."""
import json
import math
import os
import sys
from math import comb


def mcnemar(b, c):
    """Exact two-sided McNemar p-value for b and c discordant pairs."""
    n, k = b + c, min(b, c)
    return 1.0 if n == 0 else min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)


def wilson(k, n, z=1.96):
    p, d = k / n, 1 + z * z / n
    c, h = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (c - h) / d, (c + h) / d


runs = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "per_problem.json")))
for task in sys.argv[1:]:
    lost = gained = n_all = k0 = k1 = 0
    for name in sorted(r for r in runs if r.startswith(f"r0_{task}-")):
        c0, c1 = runs[name]["correct"], runs["r1_" + name[3:]]["correct"]
        b = sum(x == "1" and y == "0" for x, y in zip(c0, c1))
        c = sum(x == "0" and y == "1" for x, y in zip(c0, c1))
        print("  %s radius0 %.3f radius0.1 %.3f  lost %d gained %d" % (
            name[3:], c0.count("1") / len(c0), c1.count("1") / len(c1), b, c))
        lost, gained, n_all = lost + b, gained + c, n_all + len(c0)
        k0, k1 = k0 + c0.count("1"), k1 + c1.count("1")
    d = (k1 - k0) / n_all
    se = math.sqrt((lost + gained) - (gained - lost) ** 2 / n_all) / n_all
    print("%s n=%d radius0 %.4f [%.3f, %.3f] radius0.1 %.4f [%.3f, %.3f] diff %+.2f pt "
          "[%+.2f, %+.2f] lost %d gained %d McNemar p=%.4f" % (
              task, n_all, k0 / n_all, *wilson(k0, n_all), k1 / n_all, *wilson(k1, n_all),
              100 * d, 100 * (d - 1.96 * se), 100 * (d + 1.96 * se), lost, gained,
              mcnemar(lost, gained)))
