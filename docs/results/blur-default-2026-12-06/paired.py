# paired.py MODEL SPLIT POLICY BUDGET INTERVAL OUT.json [knob=v ...]: per-problem correctness.
# BUDGET / INTERVAL "-": none (the full cache). The same as beacon-radius-fresh-2026-12-06's
# paired.py otherwise.
import json, sys, time
from beaconkv.evaluate import evaluate
model, split, policy, budget, interval, out = sys.argv[1:7]
knobs = [k for k in sys.argv[7:]]
budget = None if budget == "-" else int(budget)
interval = None if interval == "-" else int(interval)
rows = {}
t0 = time.time()
res = evaluate(model, split, policy, budget, interval=interval, policy_knobs=knobs or None,
               on_output=lambda p, o: rows.__setitem__(str(o["id"]), bool(o["correct"])))
json.dump({"split": split, "policy": policy, "budget": budget, "interval": interval,
           "knobs": knobs, "accuracy": res.accuracy, "n": res.num_problems,
           "generated": res.engine_stats["generated_tokens"],
           "evicted": res.engine_stats.get("tokens_evicted"), "wall": time.time() - t0,
           "correct": rows}, open(out, "w"))
print(split, policy, budget, interval, knobs, "%.4f" % res.accuracy, res.num_problems)
