# Experiment (session 27, 2026-12-05): python3 docs/results/dev2-2026-12-05b/l0_attention.py (from the repo root; output beside it)
# Layer 0's attention in the full cache, two dev problems, every 7th step from 200 tokens after the prompt.
import sys, numpy as np
sys.path.insert(0, 'tools')
from beaconkv.evaluate import load_problems
from beaconkv.reference import Model
m = Model('models/tiny-reasoner'); tok = m.tokenizer
recs = load_problems('models/tiny-reasoner', 'dev', 6)
for pi in [2, 4]:
    rec = recs[pi]
    p = m.encode_prompt(rec['prompt']); ids = np.array(p + tok.encode(rec['target']) + [tok.eos_id])
    _, att, q = m.trace(list(ids)); T = len(ids)
    print('problem', pi, 'T', T, 'prompt', len(p), 'heads', att.shape)
    for h in range(att.shape[1]):
        same, prm, top1, ent, far = [], [], [], [], []
        for t in range(len(p) + 200, T - 1, 7):
            a = att[0, h, t, :t + 1]
            same.append(a[:t][ids[:t] == ids[t]].sum()); prm.append(a[:len(p)].sum())
            top1.append(a.max()); ent.append(np.exp(-(a * np.log(a + 1e-12)).sum()))
            far.append(a[:max(t - 52, 0)].sum())
        print(f" L0 qh{h}: same-id mass {np.mean(same):.2f} prompt mass {np.mean(prm):.2f} "
              f"beyond-recent mass {np.mean(far):.2f} top1 {np.mean(top1):.2f} eff#tokens {np.mean(ent):.0f}")
