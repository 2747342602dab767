# Experiment (2026-12-05): python3 docs/results/pooled-2026-12-05/failing_problems.py dev2-61403.jsonl POLICY BUDGET INTERVAL FAILS.jsonl: the problems a policy answers wrong
import json, sys
from beaconkv.evaluate import evaluate
policy, budget, interval, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
fails = []
r = evaluate('models/tiny-reasoner', sys.argv[1], policy, budget, interval=interval,
             on_output=lambda p, o: None if o['correct'] else fails.append(p))
print(policy, budget, interval, r.accuracy, len(fails))
with open(out, 'w') as f:
    for p in sorted(fails, key=lambda p: p['id']): f.write(json.dumps(p) + '\n')
