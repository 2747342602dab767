"""Exact answers by plan length (n_steps) of `eval --json` runs on the dev split.

python3 by_steps.py DEV.jsonl RUN.json [RUN.json ...]
"""
import collections
import json
import sys

steps = {}
with open(sys.argv[1]) as f:
    for line in f:
        p = json.loads(line)
        steps[p["id"]] = p["n_steps"]
for path in sys.argv[2:]:
    with open(path) as f:
        run = json.load(f)
    by = collections.defaultdict(lambda: [0, 0])
    for pid, ok in zip(run["problem_ids"], run["correct"]):
        by[steps[pid]][0] += int(ok)
        by[steps[pid]][1] += 1
    cells = "  ".join(f"{k} steps {v[0]}/{v[1]}" for k, v in sorted(by.items()))
    print(f"{path}: {cells}")
