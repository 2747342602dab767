"""`scoring-cost-2026-12-06/perf_fold.py`, then the leaf functions under the logit product
(AttentionScores without MaxProbScores) and under the draws (FpsOrder).

python3 perf_fold_leaves.py OUT.txt   (OUT.txt: `perf script` output)
"""
import collections
import os
import runpy

fold = runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scoring-cost-2026-12-06",
                 "perf_fold.py"))
comp = fold["comp"]
for key in ["AttentionScores", "FpsOrder"]:
    sub = [s for s in comp if any(key in f for f in s) and not any("MaxProbScores" in f for f in s)]
    leaves = collections.Counter(s[0][:70] for s in sub)
    print(key, "leaves:")
    for k, v in leaves.most_common(12):
        print("  %5.1f%% %s" % (100 * v / len(comp), k))
