# Experiment (session 27, 2026-12-05): python3 docs/results/dev2-2026-12-05b/count_bias_probe.py FAILS.jsonl DEV2.jsonl
# (from the repo root; FAILS = the 26 tuning-split problems 120 / 8 redundancy=0.7 answers wrong,
# from docs/results/dev2-2026-12-05/failing_problems.py). Teacher forced: the engine replays
# beacon, the NumPy reference runs the same tokens seeing only what each head held, and layer 0
# optionally adds log(N_c / K_c) to each visible token of id c (N_c: positions <= t with id c;
# K_c: those visible). Output beside it (count_bias_probe.txt).
import json, sys
import numpy as np
sys.path.insert(0, "tools")
from layer_eviction_probe import visibility_bias, count_wrong
from beaconkv.reference import Model
from beaconkv.replay import policy_configs, replay_engine

md = "models/tiny-reasoner"
model = Model(md); tok = model.tokenizer; L = model.config.num_hidden_layers
cfg = policy_configs(["beacon"], 120, 8, {"redundancy": 0.7})["beacon"]
engine = replay_engine(md)


def type_bias(ev, ids, scale=1.0):
    b = visibility_bias(ev)
    ids = np.asarray(ids); V = ids.max() + 1
    for h in range(ev.shape[0]):
        for t in range(ev.shape[1]):
            vis = np.nonzero(np.isfinite(b[h, t, :t + 1]))[0]
            N = np.bincount(ids[:t + 1], minlength=V).astype(np.float32)
            K = np.bincount(ids[vis], minlength=V).astype(np.float32)
            b[h, t, vis] = scale * np.log(N[ids[vis]] / K[ids[vis]])
    return b


def run(recs):
    res = {"engine (all layers)": 0, "layer 0 count bias": 0, "layer 0 count bias x0.5": 0,
           "every layer count bias": 0, "layer 0 alone": 0, "layer 0 alone, count bias": 0}
    for rec in recs:
        prompt = model.encode_prompt(rec["prompt"])
        ids = prompt + tok.encode(rec["target"]) + [tok.eos_id]
        ev = np.asarray(engine.replay_evictions(ids, len(prompt), cfg)[0])
        base = [visibility_bias(ev[i]) for i in range(L)]
        tbs = [type_bias(ev[i], ids) for i in range(L)]
        variants = {"engine (all layers)": base, "layer 0 count bias": [tbs[0]] + base[1:],
                    "layer 0 count bias x0.5": [type_bias(ev[0], ids, 0.5)] + base[1:],
                    "every layer count bias": tbs,
                    "layer 0 alone": [base[0]] + [None] * (L - 1),
                    "layer 0 alone, count bias": [tbs[0]] + [None] * (L - 1)}
        for name, bias in variants.items():
            res[name] += count_wrong(model.forward(ids, bias), ids, len(prompt)) > 0
    return res


fails = [json.loads(l) for l in open(sys.argv[1])]
prompts = {r["prompt"] for r in fails}
passing = [r for r in map(json.loads, open(sys.argv[2])) if r["prompt"] not in prompts][:100]
print("problems with a wrong token, the 26 failures:", run(fails), flush=True)
print("problems with a wrong token, the first 100 passing:", run(passing), flush=True)
