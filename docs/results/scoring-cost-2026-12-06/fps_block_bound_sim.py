# How much of an FPS draw's passes a block bound could skip, on real buffers.
import json, os, sys, numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "integration"))
from beaconkv.reference import Model
MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models", "tiny-reasoner")
m = Model(MODEL)
c = m.config
p = json.loads(open(os.path.join(MODEL, "data", "dev.jsonl")).readline())
ids = [m.tokenizer.bos_id] + m.tokenizer.encode(p["prompt"] + p["target"])
_, _, q = m.trace(ids)   # [L, H, T, d]
L, H, T, d = q.shape
g = H // c.num_key_value_heads
print("shape", q.shape, "g", g)

def quant(x):
    u = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)
    return np.rint(u * 16384).astype(np.int64)

def fps_sim(Q, count, K0, blocksz=64):
    n = len(Q)
    one = 1 << 28
    mean = Q.sum(0); 
    md = np.full(n, 2**62, dtype=np.int64)
    seed = int(np.argmax(one - Q @ quant(mean[None])[0]))
    picks = [seed]; chosen = np.zeros(n, bool); chosen[seed] = True
    md = one - Q @ Q[seed]
    full_work = 0; pruned_work = 0
    blocks = None
    for k in range(1, count):
        mdm = np.where(chosen, -1, md)
        nxt = int(np.argmax(mdm)); far = mdm[nxt]
        picks.append(nxt); chosen[nxt] = True
        v = Q[nxt]
        active = ~chosen
        full_work += active.sum()
        if k == K0:
            # group active points by nearest pick so far, blocks of <= blocksz in that order
            P = Q[picks]
            near = np.argmax(Q @ P.T, axis=1)
            order = np.lexsort((np.arange(n), near))
            blocks = [order[i:i+blocksz] for i in range(0, n, blocksz)]
            info = []
            for b in blocks:
                cb = Q[b].mean(0)
                rho = np.sqrt(((Q[b] - cb) ** 2).sum(1)).max()
                info.append((cb, rho))
        if blocks is None:
            pruned_work += active.sum()
        else:
            vn = np.sqrt((v.astype(float) ** 2).sum())
            for b, (cb, rho) in zip(blocks, info):
                act = active[b]
                if not act.any(): continue
                bound = one - (cb @ v) - rho * vn   # lower bound of every distance in block
                if bound >= md[b][act].max():
                    continue  # skip
                pruned_work += act.sum()
        md = np.minimum(md, one - Q @ v)
    return full_work, pruned_work

for layer in range(L):
    for kv in range(c.num_key_value_heads):
        rows = q[layer, kv*g:(kv+1)*g, :, :]  # [g, T, d]
        buf = rows.transpose(1, 0, 2).reshape(-1, d)[-1024:-512]  # 512 queries
        Q = quant(buf.astype(np.float64))
        _, uniq = np.unique(Q, axis=0, return_index=True)
        if len(uniq) < 300: 
            print(layer, kv, "distinct", len(uniq), "skip"); continue
        for K0 in (16, 32):
            f, pr = fps_sim(Q, 256, K0)
            print(layer, kv, "K0", K0, "work %.2f of full" % (pr / f))
