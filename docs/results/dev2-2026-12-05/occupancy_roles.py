# Experiment (session 26, 2026-12-05): python3 docs/results/dev2-2026-12-05/occupancy_roles.py MODEL SPLIT B I NUM LAYER (run from the repo root; output beside it)
# Layer-L occupancy by token class: mean number of alive non-recent tokens per step, beacon vs oracle.
import sys, numpy as np, collections
sys.path.insert(0, 'tools')
import future_oracle as fo
from beaconkv.evaluate import load_problems
from beaconkv.reference import Model
from beaconkv.replay import policy_configs, replay_engine
model_dir, split, B, I, num, L = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
knobs = dict(k.split('=') for k in sys.argv[7:]) or None
m = Model(model_dir); tok = m.tokenizer; c = m.config; G = c.num_attention_heads // c.num_key_value_heads
cfg = policy_configs(['beacon'], B, I, knobs)['beacon']; eng = replay_engine(model_dir)
occ = {'beacon': collections.Counter(), 'oracle': collections.Counter()}
steps = 0
for rec in load_problems(model_dir, split, num):
    p = m.encode_prompt(rec['prompt']); ids = p + tok.encode(rec['target']) + [tok.eos_id]
    _, att, _ = m.trace(ids); T = len(ids); cl = np.array(['p'] * len(p) + list(rec['roles']) + ['E'])
    ev_b = np.asarray(eng.replay_evictions(ids, len(p), cfg)[0])[L]
    for h in range(c.num_key_value_heads):
        A = att[L, h*G:(h+1)*G].max(0)  # [T,T]
        fut = fo.future_max(att[L, h*G:(h+1)*G])
        ev_o = fo.oracle_evictions(fut, len(p), B, I, cfg.n_sinks, cfg.n_recent)
        # strong-read-so-far mask: readq[t,q] = some query in (q+48, t] read q > 0.3
        strong = (A > 0.3)
        for t in range(len(p) + B + I, T, 8):
            pos = np.arange(cfg.n_sinks, t - cfg.n_recent)
            for name, ev in (('beacon', ev_b[h]), ('oracle', ev_o)):
                al = pos[ev[pos] > t]
                for q in al:
                    k = cl[q]
                    wasread = strong[q + cfg.n_recent + 1:t + 1, q].any()
                    willread = fut[t, q] > 0.3
                    occ[name][(k, 'read' if wasread else 'unread', 'will' if willread else 'wont')] += 1
            steps += 1
print(split, B, I, 'layer', L, 'mean alive (non-protected) tokens per step, by class / read before / strong read later')
keys = sorted(set(occ['beacon']) | set(occ['oracle']))
for k in keys:
    print(f"  {k[0]:8s} {k[1]:6s} {k[2]:4s} beacon {occ['beacon'][k]/steps:6.2f}  oracle {occ['oracle'][k]/steps:6.2f}")
