# Experiment (session 26, 2026-12-05): python3 docs/results/dev2-2026-12-05/proxy_variants.py MODEL SPLIT B I NUM LAYERS VARIANTS (run from the repo root; output beside it)
# Teacher-forced: layer(s) LAYERS replayed in Python with beacon-like scores (every past query older than
# the recent window rotated to t + the recent post-RoPE queries), variants; other layers = engine.
import sys, numpy as np
sys.path.insert(0, 'tools')
import future_oracle as fo
from beaconkv.evaluate import load_problems
from beaconkv.reference import Model, rope
from beaconkv.replay import policy_configs, replay_engine
model_dir, split, B, I, num = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
layers = [int(x) for x in sys.argv[6].split(',')]
variants = sys.argv[7].split(',')
m = Model(model_dir); tok = m.tokenizer; c = m.config; G = c.num_attention_heads // c.num_key_value_heads; D = c.head_dim
cfg = policy_configs(['beacon'], B, I, None)['beacon']; eng = replay_engine(model_dir); R, S = cfg.n_recent, cfg.n_sinks
def sm(x):
    x = x - x.max(1, keepdims=True); e = np.exp(x); return e / e.sum(1, keepdims=True)
def replay(Q, K, start, T, variant):
    ev = np.full(T, fo.NEVER, dtype=np.int64)
    alive = list(range(start))
    for t in range(start, T):
        alive.append(t)
        if len(alive) < B + I: continue
        al = np.asarray(alive)
        prot = np.zeros(len(al), bool); prot[:S] = True; prot[len(al) - R:] = True
        nr = R if not variant.startswith('rec') else int(variant[3:])
        rec_pos = np.arange(t + 1 - nr, t + 1)
        if variant.startswith('rd'): rec_pos = np.arange(t + 1 - int(variant[2:]), t + 1)
        rq = np.concatenate([rope(Q[g, rec_pos], rec_pos, c.rope_theta) for g in range(G)])
        rp = np.tile(rec_pos, G)
        lr = rq @ K[al].T / np.sqrt(D); lr = np.where(al[None] <= rp[:, None], lr, -np.inf)
        score = sm(lr).max(0)
        if variant.startswith('ra'): score = score * float(variant[2:])
        old = np.arange(start if variant == 'nopq' else 0, t + 1 - nr)
        if len(old):
            oq = rope(Q[:, old].reshape(-1, D), np.full(G * len(old), t), c.rope_theta)
            op = np.repeat(old[None], G, 0).reshape(-1)
            lo = oq @ K[al].T / np.sqrt(D)
            if variant == 'causal':
                lo = np.where(al[None] <= op[:, None], lo, -np.inf)
                Po = sm(lo)
            elif variant == 'causalpost':  # softmax over all, then zero the non-causal entries
                Po = np.where(al[None] <= op[:, None], sm(lo), 0.0)
            else:
                Po = sm(lo)
            score = np.maximum(score, Po.max(0))
        if variant.startswith('pm'): score = np.where(al < start, score * float(variant[2:]), score)
        if variant.startswith('pp'): score = np.where(al < start, score + float(variant[2:]), score)
        rest = np.nonzero(~prot)[0]; free = B - prot.sum()
        order = np.lexsort((-al[rest], -score[rest]))
        drop = al[rest[order[free:]]]
        ev[drop] = t
        keep = np.ones(len(al), bool); keep[rest[order[free:]]] = False
        alive = al[keep].tolist()
    return ev
bad = {v: 0 for v in ['engine'] + variants}
n = 0
for rec in load_problems(model_dir, split, num):
    p = m.encode_prompt(rec['prompt']); ids = p + tok.encode(rec['target']) + [tok.eos_id]
    _, att, qpre, keys = m.trace_with_keys(ids); T = len(ids)
    ev_e = np.asarray(eng.replay_evictions(ids, len(p), cfg)[0])
    bad['engine'] += fo.wrong_tokens(m, ids, len(p), ev_e) > 0
    for v in variants:
        ev = ev_e.copy()
        for L in layers:
            for h in range(c.num_key_value_heads):
                ev[L, h] = replay(qpre[L, h*G:(h+1)*G], keys[L, h], len(p), T, v)
        bad[v] += fo.wrong_tokens(m, ids, len(p), ev) > 0
    n += 1
    if n % 25 == 0: print(n, bad, flush=True)
print(split, B, I, 'layers', layers, 'problems', n, 'with a wrong token:', bad)
