"""Replay of eviction policies on recorded full-cache traces: the "missed revisit mass".

A teacher-forced pass of the NumPy reference over prompt + reference output records, for every
position and (layer, head), the full-cache attention row, the pre-RoPE query and the post-RoPE
key. Each policy is then driven exactly as the engine drives it (``beaconkv.Policy``): the
prompt is prefilled and observed, then every decode position appends its key, is observed
(pre- and post-RoPE queries of the kv head's group) and, after the whole step, every head the
policy reports due is compressed, with all kv heads' keys of the layer passed in.

The replay is open loop: every layer sees the full-cache queries and keys, so it asks "which
tokens would the policy evict from the full-cache trajectory", free of compounding. In the
engine, from the second layer on, earlier layers' evictions change the queries and keys and so
the later choices. On a one-layer model the two coincide: the engine's teacher-forced logits
equal the reference's with attention masked to the replay's kept tokens (tested).

The replay remembers when each original position left each (layer, kv_head). The **missed
revisit mass** of query t of query head h is the share of its full-cache attention mass that
falls on positions its kv head had evicted before step t. It is reported for the queries after
the sequence's first compression (all output queries when the policy never compresses, where
it is 0), split into global and local queries with revisit.py's top-K mean distance: global
when the distance exceeds ``threshold_frac`` x sequence length.

    from beaconkv.replay import replay_split
    res = replay_split("models/tiny-reasoner", "dev", ["beacon", "snapkv"], budget=64, num=2)
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from beaconkv import task
from beaconkv.reference import Model, rope
from beaconkv.revisit import query_distances

NEVER = np.iinfo(np.int64).max  # eviction step of a position that is never evicted


def policy_configs(policies: list[str], budget: int | None = None, interval: int | None = None,
                   knobs: dict | list | None = None) -> dict:
    """{spec: config} for a grid of policy specs (``NAME[-pooled][:KNOB=VALUE,...]``) sharing
    a budget, an interval and knobs, built by the core's registry exactly as ``beaconkv eval``
    builds one: an unknown policy or knob raises ValueError."""
    import beaconkv

    return {p: beaconkv.make_policy_config(p, budget, interval=interval, knobs=knobs)
            for p in policies}


def truncate_record(rec: dict, max_target_tokens: int | None) -> dict:
    """`rec` with its target cut to `max_target_tokens` characters (one token each), roles and
    retrieval marks cut to match; None keeps it whole."""
    if max_target_tokens is None or len(rec["target"]) <= max_target_tokens:
        return rec
    n = max_target_tokens
    out = dict(rec)
    out["target"] = rec["target"][:n]
    if "roles" in rec:
        out["roles"] = rec["roles"][:n]
    if "retrieval" in rec:
        out["retrieval"] = [i for i in rec["retrieval"] if i < n]
    return out


@dataclasses.dataclass
class Trace:
    """A full-cache teacher-forced pass over `ids` (T tokens, the first `prompt_len` the prompt).

    attention:  [layers, heads, T, T] row t: weights of query t over positions 0..t.
    queries:    [layers, heads, T, head_dim] pre-RoPE queries.
    keys:       [layers, kv_heads, T, head_dim] post-RoPE keys (as the KV cache stores them).
    roles:      [T - prompt_len + 1] role letter of each output query (see revisit.py), or None.
    """

    ids: list[int]
    prompt_len: int
    attention: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    rope_theta: float
    roles: np.ndarray | None = None


def record_trace(model: Model, rec: dict) -> Trace:
    """Teacher-forced full-cache trace of one problem, keys included.

    Model.trace() returns attention and queries but not keys, so this runs the reference's own
    forward with a KV cache list, from which the post-RoPE keys are read: one pass, and the keys
    are by construction the ones the recorded attention was computed from."""
    tok = model.tokenizer
    prompt_ids = model.encode_prompt(rec["prompt"])
    ids = prompt_ids + tok.encode(rec["target"])
    cache: list = [None] * model.config.num_hidden_layers
    steps: list = []
    model._run(ids, 0, cache, steps)  # fills cache[layer] = (keys after RoPE, values)
    attention = np.stack([p for p, _ in steps])  # [L, H, T, T]
    queries = np.stack([q for _, q in steps])  # [L, H, T, hd]
    keys = np.stack([k for k, _ in cache])  # [L, KV, T, hd]
    roles = None
    if "roles" in rec and len(rec["roles"]) == len(ids) - len(prompt_ids):
        roles = np.array(list(rec["roles"] + "E"))  # the last query predicts end-of-sequence
    return Trace(ids, len(prompt_ids), attention, queries, keys, model.config.rope_theta, roles)


def eviction_steps(trace: Trace, policy_cfg) -> tuple[np.ndarray, int]:
    """Drives `policy_cfg` over the trace as the engine does.

    Returns evicted_at [layers, kv_heads, T]: the decode position after whose step the position
    was evicted (NEVER if kept to the end), and the first such step (NEVER if none)."""
    import beaconkv

    qry, keys = trace.queries, trace.keys
    n_layers, n_heads, t_len, hd = qry.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    p_len = trace.prompt_len
    q_post = rope(qry, np.arange(t_len), trace.rope_theta).astype(np.float32)  # [L, H, T, hd]
    q_pre = np.ascontiguousarray(qry, dtype=np.float32)
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    policy = beaconkv.Policy(policy_cfg, n_layers, n_kv, group, hd, trace.rope_theta, p_len)
    with_keys = policy.needs_keys_on_observe
    # kept[l][g]: original positions the head holds, ascending (slot order does not matter to
    # the policies; they order by position internally).
    kept = [[np.arange(p_len, dtype=np.int32) for _ in range(n_kv)] for _ in range(n_layers)]
    evicted_at = np.full((n_layers, n_kv, t_len), NEVER, dtype=np.int64)
    first = NEVER

    def observe(layer: int, g: int, t: int) -> None:
        hs = slice(g * group, (g + 1) * group)
        if with_keys:
            pos = kept[layer][g]
            policy.observe(layer, g, t, q_pre[layer, hs, t], q_post[layer, hs, t],
                           keys[layer, g, pos], pos)
        else:
            policy.observe(layer, g, t, q_pre[layer, hs, t], q_post[layer, hs, t])

    for layer in range(n_layers):  # prefill: every prompt query, all prompt keys present
        for t in range(p_len):
            for g in range(n_kv):
                observe(layer, g, t)
    for t in range(p_len, t_len):  # decode: append, observe, then compress what is due
        for layer in range(n_layers):
            for g in range(n_kv):
                kept[layer][g] = np.append(kept[layer][g], np.int32(t))
                observe(layer, g, t)
        for layer in range(n_layers):
            due = policy.due_heads(layer, [len(k) for k in kept[layer]])
            if not due:
                continue
            pos = kept[layer]
            sets = policy.compress(layer, [keys[layer, g, pos[g]] for g in range(n_kv)], pos,
                                   list(due), t)
            for _, g, slots in sets:
                survivors = pos[g][np.asarray(slots, dtype=np.int64)]
                gone = np.setdiff1d(pos[g], survivors)
                if len(gone):
                    evicted_at[layer, g, gone] = t
                    first = min(first, t)
                kept[layer][g] = survivors
    return evicted_at, first


def missed_mass(trace: Trace, evicted_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each output query, [layers, heads, T - prompt_len + 1] each: the share of its
    full-cache attention on positions its kv head had evicted before that query's step, and
    the number of positions the head held when the query read it."""
    att = trace.attention
    n_layers, n_heads, t_len, _ = att.shape
    group = n_heads // evicted_at.shape[1]
    start = trace.prompt_len - 1
    q_pos = np.arange(start, t_len)
    out = np.zeros((n_layers, n_heads, len(q_pos)))
    held = np.zeros((n_layers, n_heads, len(q_pos)), dtype=np.int64)
    for layer in range(n_layers):  # one layer at a time keeps the [H, Q, T] mask small
        ev = np.repeat(evicted_at[layer], group, axis=0)  # [H, T]
        gone = ev[:, None, :] < q_pos[None, :, None]  # [H, Q, T]
        out[layer] = (att[layer, :, start:, :] * gone).sum(-1)
        held[layer] = q_pos[None, :] + 1 - gone.sum(-1)
    return out, held


@dataclasses.dataclass
class ReplayResult:
    """Per-query arrays of one policy over several problems, concatenated along queries."""

    missed: np.ndarray  # [L, H, Q] missed revisit mass
    is_global: np.ndarray  # [L, H, Q] top-K mean distance above the threshold
    counted: np.ndarray  # [Q] query after the first compression of its sequence
    is_retrieval: np.ndarray  # [Q] query predicting a retrieval token (role R)
    retained: np.ndarray  # [L, H, Q] positions the query's kv head held
    full_len: np.ndarray  # [Q] positions a full cache holds (query position + 1)
    compressions: int  # sequences in which the policy evicted anything

    def summary(self) -> dict:
        m, g = self.missed, self.is_global
        c = np.broadcast_to(self.counted, m.shape)
        r = np.broadcast_to(self.is_retrieval, m.shape)
        layer = np.arange(m.shape[0])[:, None, None]

        def mean(mask, values=m):
            return float(values[mask].mean()) if mask.any() else None

        held = mean(c, self.retained)
        full = mean(c, np.broadcast_to(self.full_len, m.shape))

        return {
            "missed_mass": mean(c), "missed_mass_global": mean(c & g),
            "missed_mass_local": mean(c & ~g), "missed_mass_retrieval": mean(c & r),
            "missed_mass_per_layer": [mean(c & (layer == li)) for li in range(m.shape[0])],
            "queries": int(c.sum()), "global_queries": int((c & g).sum()),
            "sequences_compressed": self.compressions,
            "mean_retained_tokens": held, "mean_full_tokens": full,
            "compression_ratio": full / held if held else None,
        }


def replay_traces(traces: Iterable[Trace], policies: dict, k_max: int = 150,
                  threshold_frac: float = 0.15, distances: list | None = None) -> dict:
    """Replays every policy config of `policies` ({label: config}) on every trace.

    Returns {label: ReplayResult}. `traces` may be a generator: each trace is dropped once
    replayed (a full trace's attention is ~90 MB). `distances` (per trace,
    revisit.query_distances' top-K array) may be passed in when already computed."""
    parts: dict = {label: [] for label in policies}
    glob, retrieval = [], []
    for i, tr in enumerate(traces):
        start = tr.prompt_len - 1  # the query at position p predicts token p + 1
        if distances is None:
            topk = query_distances(tr.attention, start, k_max)[0]
        else:
            topk = distances[i]
        glob.append(topk > threshold_frac * len(tr.ids))
        n_q = len(tr.ids) - start
        retrieval.append(tr.roles == "R" if tr.roles is not None else np.zeros(n_q, bool))
        for label, cfg in policies.items():
            evicted_at, first = eviction_steps(tr, cfg)
            q_pos = np.arange(start, len(tr.ids))
            counted = q_pos > first if first != NEVER else np.ones(n_q, bool)
            missed, held = missed_mass(tr, evicted_at)
            parts[label].append((missed, counted, first != NEVER, held, q_pos + 1))
    out = {}
    for label, rows in parts.items():
        out[label] = ReplayResult(
            missed=np.concatenate([r[0] for r in rows], -1),
            is_global=np.concatenate(glob, -1),
            counted=np.concatenate([r[1] for r in rows]),
            is_retrieval=np.concatenate(retrieval),
            compressions=sum(r[2] for r in rows),
            retained=np.concatenate([r[3] for r in rows], -1),
            full_len=np.concatenate([r[4] for r in rows]))
    return out


def replay_split(model_dir: str, split: str, policies: list[str], budget: int | None = None,
                 num: int = 4, interval: int | None = None, knobs: dict | list | None = None,
                 k_max: int = 150, threshold_frac: float = 0.15,
                 max_target_tokens: int | None = None) -> dict:
    """Missed revisit mass of each policy spec (see policy_configs) on the first `num` problems of `split` (dev, test or a .jsonl path). Returns a JSON-ready summary."""
    from beaconkv.evaluate import resolve_split

    model = Model(model_dir)
    recs = [truncate_record(r, max_target_tokens)
            for r in task.read_split(resolve_split(model_dir, split))[:num]]
    if not recs:
        raise ValueError(f"split {split!r}: no problems to replay")
    configs = policy_configs(policies, budget, interval, knobs)
    traces = (record_trace(model, r) for r in recs)  # one at a time in memory
    results = replay_traces(traces, configs, k_max, threshold_frac)
    return {
        "budget": budget, "interval": interval, "knobs": knobs or [], "problems": len(recs),
        "k": k_max, "threshold_frac": threshold_frac,
        "max_target_tokens": max_target_tokens,
        "configs": {p: repr(c) for p, c in configs.items()},
        "policies": {p: r.summary() for p, r in results.items()},
    }


def plot_replay(summary: dict, out_dir: str, prefix: str = "replay") -> str:
    """Bar chart of missed revisit mass per policy, global vs local queries."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["policies"])
    ratios = [summary["policies"][n]["compression_ratio"] for n in names]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(1.1 * len(names) + 3, 4))
    for off, key, label in ((-0.2, "missed_mass_global", "global queries"),
                            (0.2, "missed_mass_local", "local queries")):
        vals = [summary["policies"][n][key] or 0.0 for n in names]
        ax.bar(x + off, vals, width=0.4, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{n}\n{r:.1f}x" if r else n for n, r in zip(names, ratios)])
    ax.set_ylabel("attention mass on evicted tokens")
    ax.set_xlabel("policy (mean compression of the cache the queries read)")
    ax.set_title(f"Missed revisit mass, budget {summary['budget']}, "
                 f"{summary['problems']} problems")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out_dir, f"{prefix}_missed_mass.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
