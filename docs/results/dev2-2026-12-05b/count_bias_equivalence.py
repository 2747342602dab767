# Experiment (session 27, 2026-12-05): python3 docs/results/dev2-2026-12-05b/count_bias_equivalence.py FAILS.jsonl
# (from the repo root; FAILS as in count_bias_probe.py). The engine's teacher-forced logits with
# count_bias against the NumPy reference given log(N / K) in layer 0 and the engine's evictions
# elsewhere, first four problems at 120 / 8 redundancy=0.7. Output beside it.
import json, sys
import numpy as np
sys.path.insert(0, "tools")
import beaconkv
from layer_eviction_probe import visibility_bias
from beaconkv.reference import Model
from beaconkv.replay import policy_configs, replay_engine

md = "models/tiny-reasoner"
model = Model(md); tok = model.tokenizer; L = model.config.num_hidden_layers
cfg = policy_configs(["beacon"], 120, 8, {"redundancy": 0.7, "count_bias": True})["beacon"]
engine = replay_engine(md)


def type_bias(ev, ids):
    b = visibility_bias(ev)
    ids = np.asarray(ids); V = ids.max() + 1
    for h in range(ev.shape[0]):
        for t in range(ev.shape[1]):
            vis = np.nonzero(np.isfinite(b[h, t, :t + 1]))[0]
            N = np.bincount(ids[:t + 1], minlength=V).astype(np.float32)
            K = np.bincount(ids[vis], minlength=V).astype(np.float32)
            b[h, t, vis] = np.log(N[ids[vis]] / K[ids[vis]])
    return b


for k, rec in enumerate([json.loads(l) for l in open(sys.argv[1])][:4]):
    prompt = model.encode_prompt(rec["prompt"])
    ids = prompt + tok.encode(rec["target"]) + [tok.eos_id]
    ev = np.asarray(engine.replay_evictions(ids, len(prompt), cfg)[0])
    ref = model.forward(ids, [type_bias(ev[0], ids)] + [visibility_bias(ev[i]) for i in range(1, L)])
    e = beaconkv.Engine(md, policy=cfg, max_batch=1)
    forced = ids[len(prompt):]
    e.add_request(0, prompt, forced_output=forced, return_logits=True, max_new_tokens=len(forced))
    out = None
    while e.has_unfinished:
        for o in e.step():
            out = o
    lg = np.asarray(out["logits"]).reshape(len(forced), -1)
    r = ref[len(prompt) - 1:-1]
    print(k, "max |diff|", float(np.abs(lg - r).max()), "argmax agree",
          float((lg.argmax(-1) == r.argmax(-1)).mean()))
