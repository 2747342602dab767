# Experiment (session 25): python3 missed_reads.py MODEL_DIR SPLIT BUDGET INTERVAL NUM (run from the repo root)
# Strong reads (full-cache attention > 0.3 from a query more than n_recent tokens later) whose
# token the policy had evicted by then, by token class, layer 2; beacon (engine) vs future oracle.
import sys, numpy as np, collections
sys.path.insert(0, 'tools')
import future_oracle as fo
from beaconkv.evaluate import load_problems
from beaconkv.reference import Model
from beaconkv.replay import policy_configs, replay_engine
model_dir, split, B, I, num = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
m = Model(model_dir); tok = m.tokenizer; c = m.config; G = c.num_attention_heads // c.num_key_value_heads
cfg = policy_configs(['beacon'], B, I, None)['beacon']; eng = replay_engine(model_dir)
def cls(prompt_len, text):
    chars = ['P'] * prompt_len + list(text) + ['E']
    q = text.find('?'); plan_end = prompt_len + (text.find('\n', q) + 1 if (q >= 0 and q < 100) else 0)
    out = []
    for p, ch in enumerate(chars):
        if p < prompt_len: out.append('prompt')
        elif p < plan_end: out.append('plan')
        elif ch == '\n': out.append('newline')
        elif ch.isalpha() or ch == '?': out.append('label')
        elif ch.isdigit(): out.append('digit')
        else: out.append('sign')
    return out
reads = collections.Counter(); miss = {'beacon': collections.Counter(), 'oracle': collections.Counter()}
L = 2
for rec in load_problems(model_dir, split, num):
    p = m.encode_prompt(rec['prompt']); ids = p + tok.encode(rec['target']) + [tok.eos_id]
    _, att, _ = m.trace(ids); T = len(ids); cl = cls(len(p), rec['target'])
    ev_b = np.asarray(eng.replay_evictions(ids, len(p), cfg)[0])[L]
    for h in range(c.num_key_value_heads):
        A = att[L, h*G:(h+1)*G].max(0)
        ev_o = fo.oracle_evictions(fo.future_max(att[L, h*G:(h+1)*G]), len(p), B, I, cfg.n_sinks, cfg.n_recent)
        ts, ps = np.nonzero(A > 0.3)
        for t, q in zip(ts, ps):
            if t - q <= cfg.n_recent: continue
            reads[cl[q]] += 1
            if ev_b[h, q] < t: miss['beacon'][cl[q]] += 1
            if ev_o[q] < t: miss['oracle'][cl[q]] += 1
print(split, B, I, 'layer', L, 'strong reads (>0.3, older than the recent window) and how many hit an evicted token')
for k in sorted(reads):
    print(f"  {k:8s} reads {reads[k]:6d}  beacon missed {miss['beacon'][k]:5d}  oracle missed {miss['oracle'][k]:5d}")
