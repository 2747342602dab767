# Experiment (session 25): fits the learned key prior of evals.txt; usage: python3 key_prior_fit.py MODEL_DIR OUT.json SPLIT.jsonl...
import sys, numpy as np, json
from beaconkv.task import read_split
from beaconkv.reference import Model, rope
model_dir, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
m = Model(model_dir); tok = m.tokenizer; cfg = m.config
G = cfg.num_attention_heads // cfg.num_key_value_heads
R = 48; STEP = 32
def feats(kpre, age):
    la = np.log1p(age)[:, None] / 7.0
    return np.hstack([kpre, kpre * la, np.ones_like(la), la, la * la])
acc = {}
for f in files:
    for rec in read_split(f):
        p = m.encode_prompt(rec['prompt']); ids = p + tok.encode(rec['target']) + [tok.eos_id]
        _, att, _, keys = m.trace_with_keys(ids)
        T = len(ids); pos = np.arange(T)
        for L in range(cfg.num_hidden_layers):
            kpre = rope(keys[L], -pos, cfg.rope_theta)
            for h in range(cfg.num_key_value_heads):
                A = att[L, h*G:(h+1)*G].max(0)
                suffix = np.maximum.accumulate(A[::-1], axis=0)[::-1]
                for t0 in range(127, T - 1, STEP):
                    old = np.arange(0, t0 - R + 1)
                    y = np.log(suffix[t0 + 1, old] + 1e-3)
                    X = feats(kpre[h][old], t0 - old)
                    s = acc.setdefault((L, h), [0, 0])
                    s[0] = s[0] + X.T @ X; s[1] = s[1] + X.T @ y
W = {k: np.linalg.solve(s[0] + 1e-2 * np.eye(s[0].shape[0]), s[1]) for k, s in acc.items()}
json.dump({f"{k[0]},{k[1]}": v.tolist() for k, v in W.items()}, open(out, 'w'))
print('ok', out)
