"""Does the testbed show thought revisiting? Attention-distance analysis of the tiny reasoner.

For each problem of a split, the NumPy reference reads prompt + reference output (teacher
forced; identical to the greedy trace whenever the model solves the problem, which is also
checked and reported) and records, for every output position and every (layer, query head), the
attention weights and the pre-RoPE query. Per query it computes

* the paper's measure: mean distance from the query position to its top-K attended positions
  (K = 150, or fewer when fewer positions exist);
* the attention-weighted mean distance, leaving out position 0 (the beginning-of-sequence
  token, where idle heads park their attention: an "attention sink" that says nothing about
  revisiting) and renormalising over the rest. The top-K measure mostly reflects how spread
  out the attention is, so both are reported;
* the distance to the single most-attended position (argmax), the sharpest of the three.

A query is *global* when its distance exceeds ``threshold_frac`` of the sequence length (the
paper uses 200 tokens on traces of thousands). Outputs: summary JSON, PNG plots (distance
histograms, PCA of pre-RoPE queries, layer x head map of global frequency).

Its one entry point is ``beaconkv analyze`` (beaconkv/analyze_cli.py); the figures in docs/:

    beaconkv analyze --split dev --num 20 --out docs --prefix testbed
"""

from __future__ import annotations

import os

import numpy as np

import beaconkv.task as task
from beaconkv.reference import Model


def query_distances(att: np.ndarray, start: int, k_max: int):
    """Distances of queries start..T-1. att [L, H, T, T] -> topk, weighted, argmax, each
    [L, H, T-start]."""
    n_layers, n_heads, t_len, _ = att.shape
    topk = np.zeros((n_layers, n_heads, t_len - start))
    weighted = np.zeros_like(topk)
    top1 = np.zeros_like(topk)
    for t in range(start, t_len):
        row = att[:, :, t, : t + 1]  # [L, H, t+1]
        dist = t - np.arange(t + 1)  # [t+1]
        k = min(k_max, t + 1)
        idx = np.argpartition(-row, k - 1, axis=-1)[..., :k]
        topk[:, :, t - start] = dist[idx].mean(-1)
        rest = row[..., 1:]  # without the sink at position 0
        weighted[:, :, t - start] = (rest * dist[1:]).sum(-1) / np.maximum(rest.sum(-1), 1e-12)
        top1[:, :, t - start] = dist[row.argmax(-1)]
    return topk, weighted, top1


def cosine_stats(q: np.ndarray, is_global: np.ndarray, rng: np.random.Generator,
                 max_pairs: int = 4000) -> dict:
    """Mean cosine similarity among global queries, between global and local, among local."""
    qn = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
    g, loc = qn[is_global], qn[~is_global]

    def mean_cos(a, b, same):
        if len(a) < 2 or len(b) < 2:
            return None
        ia = rng.integers(0, len(a), max_pairs)
        ib = rng.integers(0, len(b), max_pairs)
        keep = ia != ib if same else np.ones(max_pairs, bool)
        return float((a[ia[keep]] * b[ib[keep]]).sum(-1).mean())

    return {"global_global": mean_cos(g, g, True), "global_local": mean_cos(g, loc, False),
            "local_local": mean_cos(loc, loc, True), "n_global": int(len(g)),
            "n_local": int(len(loc))}


def analyze(model_dir: str, split: str, num: int, k_max: int = 150,
            threshold_frac: float = 0.15, check_greedy: bool = True) -> dict:
    model = Model(model_dir)
    recs = task.read_split(split)[:num]
    tok = model.tokenizer
    per = {"topk": [], "weighted": [], "top1": [], "role": [], "threshold": [], "query": [],
           "source_mass_plan": [], "source_mass_prompt": []}
    greedy_ok = 0
    for rec in recs:
        prompt_ids = model.encode_prompt(rec["prompt"])
        ids = prompt_ids + tok.encode(rec["target"])
        _, att, qry = model.trace(ids)
        start = len(prompt_ids) - 1  # query at position p predicts token p + 1
        topk, weighted, top1 = query_distances(att, start, k_max)
        roles = rec["roles"] + "E"  # the last query predicts end-of-sequence
        per["topk"].append(topk)
        per["weighted"].append(weighted)
        per["top1"].append(top1)
        per["role"].append(np.array(list(roles)))
        per["threshold"].append(np.full(len(roles), threshold_frac * len(ids)))
        per["query"].append(qry[:, :, start:, :])
        # Where do the queries predicting retrieval tokens look: the plan or the prompt?
        plan_end = len(prompt_ids) + rec["target"].index("?") + 2
        r_pos = [start + i for i in rec["retrieval"]]
        mass_plan = att[:, :, r_pos, len(prompt_ids):plan_end].sum(-1)  # [L, H, R]
        mass_prompt = att[:, :, r_pos, 1:len(prompt_ids)].sum(-1)
        per["source_mass_plan"].append(mass_plan)
        per["source_mass_prompt"].append(mass_prompt)
        if check_greedy:
            out, _ = model.generate(prompt_ids, len(rec["target"]) + 8)
            greedy_ok += tok.decode(out) == rec["target"]
    topk = np.concatenate(per["topk"], -1)  # [L, H, Q]
    weighted = np.concatenate(per["weighted"], -1)
    top1 = np.concatenate(per["top1"], -1)
    role = np.concatenate(per["role"])  # [Q]
    thr = np.concatenate(per["threshold"])  # [Q]
    query = np.concatenate(per["query"], 2)  # [L, H, Q, hd]
    glob_w = weighted > thr
    glob_k = topk > thr
    glob_1 = top1 > thr
    is_r = role == "R"
    n_layers, n_heads = topk.shape[:2]
    rng = np.random.default_rng(0)
    heads = []
    for li in range(n_layers):
        for h in range(n_heads):
            g = glob_w[li, h]
            heads.append({
                "layer": li, "head": h,
                "global_frac_weighted": float(g.mean()),
                "global_frac_topk": float(glob_k[li, h].mean()),
                "global_frac_argmax": float(glob_1[li, h].mean()),
                "argmax_global_frac_on_retrieval": float(glob_1[li, h][is_r].mean()),
                "argmax_global_frac_elsewhere": float(glob_1[li, h][~is_r].mean()),
                "global_frac_on_retrieval": float(g[is_r].mean()),
                "global_frac_elsewhere": float(g[~is_r].mean()),
                "retrieval_share_of_globals": float(is_r[g].mean()) if g.any() else None,
                "cosine": cosine_stats(query[li, h], g, rng),
            })
    plan_mass = np.concatenate(per["source_mass_plan"], -1)
    prompt_mass = np.concatenate(per["source_mass_prompt"], -1)
    summary = {
        "model": model_dir, "split": split, "problems": len(recs), "k": k_max,
        "threshold_frac": threshold_frac, "mean_threshold_tokens": float(thr.mean()),
        "queries_per_head": int(topk.shape[-1]),
        "greedy_exact": greedy_ok if check_greedy else None,
        "global_frac_weighted": float(glob_w.mean()),
        "global_frac_topk": float(glob_k.mean()),
        "global_frac_argmax": float(glob_1.mean()),
        "retrieval_query_frac": float(is_r.mean()),
        "global_frac_weighted_by_role": {r: float(glob_w[:, :, role == r].mean())
                                         for r in sorted(set(role))},
        "global_frac_argmax_by_role": {r: float(glob_1[:, :, role == r].mean())
                                       for r in sorted(set(role))},
        "global_frac_topk_by_role": {r: float(glob_k[:, :, role == r].mean())
                                     for r in sorted(set(role))},
        "retrieval_attention_mass_plan": plan_mass.mean((-1)).round(3).tolist(),
        "retrieval_attention_mass_prompt": prompt_mass.mean((-1)).round(3).tolist(),
        "heads": heads,
    }
    arrays = {"topk": topk, "weighted": weighted, "top1": top1, "role": role, "threshold": thr,
              "query": query}
    return {"summary": summary, "arrays": arrays}


def plot(result: dict, out_dir: str, prefix: str = "testbed") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, s = result["arrays"], result["summary"]
    topk, weighted, role, thr = a["topk"], a["weighted"], a["role"], a["threshold"]
    is_r = role == "R"
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    bins = np.linspace(0, max(topk.max(), weighted.max()) + 1, 60)
    for ax, data, name in ((axes[0], topk, f"mean distance to top-{s['k']} positions"),
                           (axes[1], weighted, "attention-weighted mean distance")):
        ax.hist(data[:, :, ~is_r].ravel(), bins=bins, alpha=0.6, label="other queries",
                density=True)
        ax.hist(data[:, :, is_r].ravel(), bins=bins, alpha=0.6, label="queries predicting "
                "retrieval tokens", density=True)
        ax.axvline(s["mean_threshold_tokens"], color="k", ls="--", lw=1,
                   label="global threshold (mean)")
        ax.set_yscale("log")
        ax.set_xlabel(name + " (tokens)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("density (all layers and heads)")
    fig.suptitle(f"Query distances, {s['problems']} dev problems")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, f"{prefix}_distance_hist.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    n_layers, n_heads = topk.shape[:2]
    frac = np.array([[h["global_frac_weighted"] for h in s["heads"] if h["layer"] == li]
                     for li in range(n_layers)])
    fig, ax = plt.subplots(figsize=(1.2 * n_heads + 2.5, 0.8 * n_layers + 1.5))
    im = ax.imshow(frac, cmap="viridis", vmin=0)
    for li in range(n_layers):
        for h in range(n_heads):
            ax.text(h, li, f"{frac[li, h]:.3f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xlabel("query head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.set_title("fraction of global queries (weighted distance)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, f"{prefix}_global_map.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    # The head whose global queries are most specific to the plan re-reading steps.
    best = max(s["heads"], key=lambda h: h["global_frac_on_retrieval"] - h["global_frac_elsewhere"])
    li, h = best["layer"], best["head"]
    q = a["query"][li, h]
    g = weighted[li, h] > thr
    qc = q - q.mean(0)
    _, _, vt = np.linalg.svd(qc, full_matrices=False)
    xy = qc @ vt[:2].T
    fig, ax = plt.subplots(figsize=(6, 5))
    r = role == "R"
    ax.scatter(xy[~g, 0], xy[~g, 1], s=2, alpha=0.2, label="local")
    ax.scatter(xy[g & ~r, 0], xy[g & ~r, 1], s=4, alpha=0.5, label="global, other")
    ax.scatter(xy[g & r, 0], xy[g & r, 1], s=6, alpha=0.7, label="global, predicting retrieval")
    ax.set_title(f"PCA of pre-RoPE queries, layer {li} head {h}")
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, f"{prefix}_query_pca.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
