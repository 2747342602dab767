# Experiment (session 26, 2026-12-05): python3 docs/results/dev2-2026-12-05/who_scores.py MODEL SPLIT B I NUM LAYER (run from the repo root; output beside it)
# For layer L at the engine's compressions (beacon, B/I), which observation row gives each alive
# unprotected token its max score (proxy: every past query older than the recent window rotated to t,
# plus the 48 recent post-RoPE queries); split by whether the token is read later (oracle's future max).
import sys, numpy as np, collections
sys.path.insert(0, 'tools')
import future_oracle as fo
from beaconkv.evaluate import load_problems
from beaconkv.reference import Model, rope
from beaconkv.replay import policy_configs, replay_engine
model_dir, split, B, I, num, L = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
m = Model(model_dir); tok = m.tokenizer; c = m.config; G = c.num_attention_heads // c.num_key_value_heads; D = c.head_dim
cfg = policy_configs(['beacon'], B, I, None)['beacon']; eng = replay_engine(model_dir); R = cfg.n_recent
def sm(x):
    x = x - x.max(1, keepdims=True); e = np.exp(x); return e / e.sum(1, keepdims=True)
stats = collections.defaultdict(collections.Counter)
for rec in load_problems(model_dir, split, num):
    pr = m.encode_prompt(rec['prompt']); ids = pr + tok.encode(rec['target']) + [tok.eos_id]
    roles = ['p'] * len(pr) + list(rec['roles']) + ['E']
    _, att, qpre, keys = m.trace_with_keys(ids); T = len(ids)
    evall = np.asarray(eng.replay_evictions(ids, len(pr), cfg)[0])[L]
    for h in range(c.num_key_value_heads):
        fut = fo.future_max(att[L, h*G:(h+1)*G]); ev = evall[h]
        K = keys[L, h]; Q = qpre[L, h*G:(h+1)*G]
        comp_times = sorted(set(ev[ev < fo.NEVER].tolist()))
        for t in comp_times[::2]:
            alive = np.array([p for p in range(t + 1) if ev[p] >= t])
            unprot = alive[cfg.n_sinks:len(alive) - R]
            rec_pos = np.arange(t + 1 - R, t + 1)
            rq = np.concatenate([rope(Q[g, rec_pos], rec_pos, c.rope_theta) for g in range(G)])
            rp = np.tile(rec_pos, G)
            old = np.arange(0, t + 1 - R)
            oq = rope(Q[:, old].reshape(-1, D), np.full(G * len(old), t), c.rope_theta)
            op = np.repeat(old[None], G, 0).reshape(-1)
            Ka = K[alive]
            lr = rq @ Ka.T / np.sqrt(D); lr = np.where(alive[None] <= rp[:, None], lr, -np.inf)
            P = np.vstack([sm(lr), sm(oq @ Ka.T / np.sqrt(D))])
            src = np.concatenate([rp, op]); isrec = np.concatenate([np.ones(len(rp), bool), np.zeros(len(op), bool)])
            idx = {p: i for i, p in enumerate(alive)}
            kept_after = set(p for p in alive if ev[p] > t)
            for p in unprot:
                col = P[:, idx[p]]; a = int(col.argmax()); s = col[a]
                fate = 'kept' if p in kept_after else 'evicted'
                will = 'will' if fut[t, p] > 0.3 else ('weak' if fut[t, p] > 0.05 else 'wont')
                who = 'recent' if isrec[a] else ('same' if src[a] >= p else 'before') + ':' + roles[src[a]]
                stats[(roles[p], will, fate)][who] += 1
                stats[(roles[p], will, fate)]['_n'] += 1
                stats[(roles[p], will, fate)]['_s'] += s
for k in sorted(stats):
    st = stats[k]; n = st.pop('_n'); s = st.pop('_s')
    top = ', '.join(f"{w} {v}" for w, v in st.most_common(5))
    print(f"{k[0]:2s} {k[1]:4s} {k[2]:8s} n={n:5d} mean score {s/n:.3f} | {top}")
