"""paired.py PREFIX SEED...: off vs on (score_bf16) per problem, pooled over the seeds:
accuracies with Wilson 95 % intervals, paired difference with a normal 95 % interval,
lost / gained, McNemar's exact two-sided p."""
import json, math, sys
from math import comb

def wilson(k, n, z=1.96):
    p = k / n; d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d; h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h

prefix, seeds = sys.argv[1], sys.argv[2:]
off, on = [], []
for s in seeds:
    a = json.load(open(f"{prefix}-{s}-off.json")); b = json.load(open(f"{prefix}-{s}-on.json"))
    assert a["problem_ids"] == b["problem_ids"]
    off += [bool(x) for x in a["correct"]]; on += [bool(x) for x in b["correct"]]
    print(f"  seed {s}: off {a['accuracy']:.3f}  on {b['accuracy']:.3f}  "
          f"generated {a['engine_stats']['generated_tokens']} / {b['engine_stats']['generated_tokens']}")
n = len(off); k0, k1 = sum(off), sum(on)
lost = sum(1 for x, y in zip(off, on) if x and not y); gained = sum(1 for x, y in zip(off, on) if y and not x)
d = (k1 - k0) / n
var = ((lost + gained) / n - d * d) / n
m = lost + gained
p = min(1.0, 2 * sum(comb(m, i) for i in range(0, min(lost, gained) + 1)) / 2 ** m) if m else 1.0
lo0, hi0 = wilson(k0, n); lo1, hi1 = wilson(k1, n)
print(f"{prefix}: n={n} off {k0/n:.4f} [{lo0:.3f}, {hi0:.3f}]  on {k1/n:.4f} [{lo1:.3f}, {hi1:.3f}]  "
      f"diff {100*d:+.2f} [{100*(d-1.96*math.sqrt(var)):+.2f}, {100*(d+1.96*math.sqrt(var)):+.2f}] points  "
      f"lost/gained {lost}/{gained}  McNemar p={p:.3g}")
