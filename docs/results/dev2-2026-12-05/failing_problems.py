# Experiment (session 26, 2026-12-05): python3 docs/results/dev2-2026-12-05/failing_problems.py dev2-61403.jsonl FAILS.jsonl: the problems 120 / 8 redundancy=0.7 answers wrong
import json, sys
from beaconkv.evaluate import evaluate
fails = []
r = evaluate('models/tiny-reasoner', sys.argv[1], 'beacon', 120, interval=8, policy_knobs={'redundancy': 0.7},
             on_output=lambda p, o: None if o['correct'] else fails.append(p))
print(r.accuracy, len(fails))
with open(sys.argv[2], 'w') as f:
    for p in sorted(fails, key=lambda p: p['id']): f.write(json.dumps(p) + '\n')
