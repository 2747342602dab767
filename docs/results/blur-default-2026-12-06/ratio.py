"""ratio.py POLICY_PREFIX [FULL_PREFIX]: accuracy of a set of runs as a share of the full
cache's on the same problems, pooled over every split both have, with a 95 % interval from a
paired bootstrap over problems (2,000 resamples, seed 0). Runs are read as compare.py reads
them (per_problem.json here and in the two directories it names).

    python3 ratio.py b158          # beacon 158 / 32 defaults against the full cache"""
import json
import os
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
runs = {}
for p in ("per_problem.json", "../blurred-beacons-2026-12-06/per_problem.json",
          "../beacon-radius-fresh-2026-12-06/per_problem.json"):
    runs.update(json.load(open(os.path.join(here, p))))
a = sys.argv[1]
f = sys.argv[2] if len(sys.argv) > 2 else "full"
xs, ys = [], []
for name in sorted(r for r in runs if r.startswith(f + "_")):
    other = a + name[len(f):]
    if other not in runs:
        continue
    c_full, c_pol = runs[name]["correct"], runs[other]["correct"]
    assert len(c_full) == len(c_pol), name
    xs += [c == "1" for c in c_full]
    ys += [c == "1" for c in c_pol]
    print("  %s full %.3f %s %.3f" % (name[len(f) + 1:], c_full.count("1") / len(c_full), a,
                                      c_pol.count("1") / len(c_pol)))
x, y = np.array(xs, float), np.array(ys, float)
rng = np.random.default_rng(0)
idx = rng.integers(0, len(x), size=(2000, len(x)))
boot = y[idx].sum(1) / x[idx].sum(1)
print("n=%d full %.4f %s %.4f ratio %.4f [%.4f, %.4f]" % (
    len(x), x.mean(), a, y.mean(), y.sum() / x.sum(), *np.percentile(boot, [2.5, 97.5])))
