# Experiment (session 26, 2026-12-05): python3 docs/results/dev2-2026-12-05/probe_one.py  (run from the repo root; output beside it)
import sys, numpy as np
sys.path.insert(0, 'tools')
from beaconkv.evaluate import load_problems
from beaconkv.reference import Model, rope
m = Model('models/tiny-reasoner'); tok = m.tokenizer; c = m.config; G = 2; D = c.head_dim
recs = load_problems('models/tiny-reasoner', 'dev', 20)
def sm(x): x = x - x.max(); e = np.exp(x); return e / e.sum()
for pi in [4, 6]:
    rec = recs[pi]
    p = m.encode_prompt(rec['prompt']); ids = p + tok.encode(rec['target']) + [tok.eos_id]
    chars = [tok.decode([i]) for i in ids]
    roles = ['p'] * len(p) + list(rec['roles']) + ['E']
    _, att, qpre, keys = m.trace_with_keys(ids); T = len(ids)
    L = 2
    # step label positions (role L after the plan) -> the step query at the label's first letter
    plan_L = [i for i in range(len(p), T) if roles[i] == 'L' and roles[i+1] == 'P']
    step_L = [i for i in range(len(p), T) if roles[i] == 'L' and roles[i+1] == 'R']
    print('problem', pi, 'plan L', len(plan_L), 'steps', len(step_L))
    for k in [3, 8, 13]:
        tq = step_L[k]; letter = chars[tq]
        sL = [i for i in plan_L if chars[i] == letter][0]
        for h in range(2):
            for g in range(G):
                qh = h * G + g
                a = att[L, qh, tq, :tq + 1]
                top = np.argsort(-a)[:3]
                K = keys[L, h, :tq + 1]
                def rot(s): return rope(qpre[L, qh, s][None], np.array([tq]), c.rope_theta)[0]
                ap = sm(rot(sL) @ K.T / np.sqrt(D))   # plan-writing query of this letter, rotated to tq
                prev = step_L[k - 1]
                aq = sm(rot(prev) @ K.T / np.sqrt(D))  # previous step's label query rotated to tq
                tgt = sL + 1  # the plan second letter
                cos = lambda a_, b_: float(a_ @ b_ / np.linalg.norm(a_) / np.linalg.norm(b_))
                print(f" step {k} '{letter}' L2 kvh{h} qh{qh}: true top {[(int(x), chars[x], round(float(a[x]),2)) for x in top]} | plan-writing q ({sL}) -> plan letter {ap[tgt]:.3f}, its top {int(ap.argmax())}:{chars[ap.argmax()]} {ap.max():.2f} | prev-step q -> {aq[tgt]:.3f} | cos(step q, plan q) {cos(qpre[L,qh,tq], qpre[L,qh,sL]):.2f} cos(step q, prev) {cos(qpre[L,qh,tq], qpre[L,qh,prev]):.2f}")
