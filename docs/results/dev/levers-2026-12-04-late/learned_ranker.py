# Experiment (session 25): python3 learned_ranker.py fit MODEL B I LAYERS OUT.json SPLIT.jsonl... | eval MODEL B I LAYERS W.json|none SPLIT NUM
# Feasibility: a learned ranker from features a real policy can compute at compression time,
# trained to imitate the future oracle's keep sets; evaluated with the teacher-forced check.
# Features per alive, unprotected token at compression t0 (per layer, kv head):
#   b = log(max over observation rows of softmax attention over the ALIVE keys) where rows are
#       the group's newest n_recent queries (own positions) and every older query rotated to t0
#       (beacon with every past query, on the compressed cache),
#   r = log(max attention from the newest n_recent queries alone),
#   k = pre-RoPE key (32), age features.
import sys, numpy as np
sys.path.insert(0, 'tools')
import future_oracle as fo
from beaconkv.evaluate import load_problems
from beaconkv.task import read_split
from beaconkv.reference import Model, rope
mode = sys.argv[1]  # fit | eval
model_dir = sys.argv[2]
m = Model(model_dir); tok = m.tokenizer; c = m.config
G = c.num_attention_heads // c.num_key_value_heads; D = c.head_dim
B, I, R, S = int(sys.argv[3]), int(sys.argv[4]), 48, 4

def softmax_rows(x):
    x = x - x.max(1, keepdims=True); e = np.exp(x); return e / e.sum(1, keepdims=True)

def feats(qpre, keys, kpre, alive, t0):
    # qpre [G, T, D] pre-RoPE queries, keys [T, D] post-RoPE
    al = np.asarray(alive)
    K = keys[al]
    old_q = qpre[:, :max(t0 + 1 - R, 0)].reshape(-1, D)
    rec_pos = np.arange(max(t0 + 1 - R, 0), t0 + 1)
    rec_q = np.concatenate([rope(qpre[g, rec_pos], rec_pos, c.rope_theta) for g in range(G)])
    old_rot = rope(old_q, np.full(len(old_q), t0), c.rope_theta) if len(old_q) else np.zeros((0, D))
    # causal: a recent query at position t sees keys <= t
    lr = rec_q @ K.T / np.sqrt(D)
    rp = np.tile(rec_pos, G)
    lr = np.where(al[None, :] <= rp[:, None], lr, -np.inf)
    pr = softmax_rows(lr).max(0)
    pb = pr.copy()
    if len(old_rot):
        pb = np.maximum(pb, softmax_rows(old_rot @ K.T / np.sqrt(D)).max(0))
    age = (t0 - al) / 512.0
    la = np.log1p(t0 - al)[:, None] / 7.0
    kp = kpre[al]
    X = np.hstack([np.log(pb + 1e-4)[:, None], np.log(pr + 1e-4)[:, None], kp, kp * la, la, la * la, np.ones_like(la)])
    return X, pb

def replay(attn_g, qpre, keys, kpre, start, W=None, collect=None):
    T = keys.shape[0]
    fut = fo.future_max(attn_g)
    ev = np.full(T, fo.NEVER, dtype=np.int64)
    alive = list(range(start))
    for t in range(start, T):
        alive.append(t)
        if len(alive) < B + I: continue
        prot = set(alive[:S]) | set(alive[len(alive) - R:])
        rest = [p for p in alive if p not in prot]
        free = B - len(prot)
        X, pb = feats(qpre, keys, kpre, rest, t)
        if collect is not None:
            y = fut[t, rest]
            thr = np.sort(y)[::-1][free - 1]
            collect.append((X, (y >= thr).astype(np.float64)))
        score = pb if W is None else X @ W
        order = np.lexsort((-np.asarray(rest), -score))  # by score desc, ties newer first
        drop = set(np.asarray(rest)[order[free:]].tolist())
        for p in drop: ev[p] = t
        alive = [p for p in alive if p not in drop]
    return ev

def problem_arrays(rec):
    p = m.encode_prompt(rec['prompt']); ids = p + tok.encode(rec['target']) + [tok.eos_id]
    logits, att, qpre, keys = m.trace_with_keys(ids)
    T = len(ids); pos = np.arange(T)
    return p, ids, att, qpre, keys, pos

layers = [int(x) for x in sys.argv[5].split(',')]  # layers the learned ranker replaces beacon in
if mode == 'fit':
    out = sys.argv[6]; files = sys.argv[7:]
    data = {}
    for f in files:
        for rec in read_split(f)[:40]:
            p, ids, att, qpre, keys, pos = problem_arrays(rec)
            for L in layers:
                kpre = rope(keys[L], -pos, c.rope_theta)
                for h in range(c.num_key_value_heads):
                    col = data.setdefault((L, h), [])
                    replay(att[L, h*G:(h+1)*G], qpre[L, h*G:(h+1)*G], keys[L, h], kpre[h], len(p), collect=col)
    Ws = {}
    for k, col in data.items():
        X = np.concatenate([a for a, _ in col]); y = np.concatenate([b for _, b in col])
        w = np.zeros(X.shape[1])
        for it in range(300):  # logistic regression, gradient descent with L2
            z = X @ w; pz = 1 / (1 + np.exp(-z))
            g = X.T @ (pz - y) / len(y) + 1e-3 * w
            w -= 0.5 * g
        acc = ((X @ w > 0) == (y > 0.5)).mean()
        print(k, 'rows', len(y), 'train acc %.3f' % acc, 'w_b %.2f w_r %.2f' % (w[0], w[1]), flush=True)
        Ws[f"{k[0]},{k[1]}"] = w.tolist()
    import json; json.dump(Ws, open(out, 'w'))
else:
    import json
    Wj = json.load(open(sys.argv[6])) if sys.argv[6] != 'none' else None
    split = sys.argv[7]; num = int(sys.argv[8])
    from beaconkv.replay import policy_configs, replay_engine
    cfg = policy_configs(['beacon'], B, I, None)['beacon']; eng = replay_engine(model_dir)
    bad = {'beacon': 0, 'proxy': 0, 'learned': 0}
    for rec in load_problems(model_dir, split, num):
        p, ids, att, qpre, keys, pos = problem_arrays(rec)
        ev_e = np.asarray(eng.replay_evictions(ids, len(p), cfg)[0])
        ev_p = ev_e.copy(); ev_l = ev_e.copy()
        for L in layers:
            kpre = rope(keys[L], -pos, c.rope_theta)
            for h in range(c.num_key_value_heads):
                a = (att[L, h*G:(h+1)*G], qpre[L, h*G:(h+1)*G], keys[L, h], kpre[h], len(p))
                ev_p[L, h] = replay(*a)
                if Wj: ev_l[L, h] = replay(*a, W=np.asarray(Wj[f"{L},{h}"]))
        for name, ev in (('beacon', ev_e), ('proxy', ev_p), ('learned', ev_l)):
            bad[name] += fo.wrong_tokens(m, ids, len(p), ev) > 0
    print(split, B, I, 'layers', layers, bad)
