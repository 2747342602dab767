"""Replay of eviction policies on recorded full-cache traces: the "missed revisit mass".

A teacher-forced pass of the NumPy reference over prompt + reference output records, for every
position and (layer, head), the full-cache attention row, the pre-RoPE query and the post-RoPE
key. Each policy's evictions come from the C++ engine itself (``Engine.replay_evictions``):
the engine teacher-forces the same tokens under the policy with its own observe/compress loop
and records when each position left each (layer, kv_head). There is no second drive loop: the
evictions are exactly those of a teacher-forced engine run (``beaconkv eval``'s forced mode),
closed loop, i.e. from the second layer on they follow the queries and keys of the engine's
compressed cache, not the full-cache ones. The engine does not compress after a sequence's last
step, so a position is never "evicted at" the trace's last position.

The **missed revisit mass** of query t of query head h is the share of its full-cache attention
mass that falls on positions its kv head had evicted before step t. It is reported for the
queries after the sequence's first compression (all output queries when the policy never
compresses, where it is 0), split into global and local queries with revisit.py's top-K mean
distance: global when the distance exceeds ``threshold_frac`` x sequence length.

    from beaconkv.replay import replay_split
    res = replay_split("models/tiny-reasoner", "dev", ["beacon", "snapkv"], budget=64, num=2)
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from beaconkv import task
from beaconkv.reference import Model
from beaconkv.revisit import query_distances

# Eviction step of a position that is never evicted: the engine's NEVER_EVICTED (int64 max).
NEVER = np.iinfo(np.int64).max


def policy_configs(policies: list[str], budget: int | None = None, interval: int | None = None,
                   knobs: dict | list | None = None, model_dir: str | None = None) -> dict:
    """{spec: config} for a grid of policy specs (``NAME[-pooled][:KNOB=VALUE,...]``) sharing
    a budget, an interval and knobs, built by the core's registry exactly as ``beaconkv eval``
    builds one (``model`` names `model_dir`'s policy): an unknown policy or knob raises
    ValueError."""
    import beaconkv

    return {p: beaconkv.make_policy_config(p, budget, interval=interval, knobs=knobs,
                                           model=model_dir)
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
    model_dir:  the checkpoint the trace was recorded from (eviction_steps runs its engine).
    """

    ids: list[int]
    prompt_len: int
    attention: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    rope_theta: float
    roles: np.ndarray | None = None
    model_dir: str | None = None


def record_trace(model: Model, rec: dict) -> Trace:
    """Teacher-forced full-cache trace of one problem, keys included (Model.trace_with_keys:
    one pass, so the keys are by construction the ones the recorded attention was computed
    from)."""
    tok = model.tokenizer
    prompt_ids = model.encode_prompt(rec["prompt"])
    ids = prompt_ids + tok.encode(rec["target"])
    _, attention, queries, keys = model.trace_with_keys(ids)
    roles = None
    if "roles" in rec and len(rec["roles"]) == len(ids) - len(prompt_ids):
        roles = np.array(list(rec["roles"] + "E"))  # the last query predicts end-of-sequence
    return Trace(ids, len(prompt_ids), attention, queries, keys, model.config.rope_theta, roles,
                 model.dir)


_engines: dict = {}  # model_dir -> an idle Engine that replays evictions


def replay_engine(model_dir: str):
    """The engine eviction_steps uses for `model_dir` (one per checkpoint, created once; its
    policy is given per replay)."""
    import beaconkv

    if model_dir not in _engines:
        _engines[model_dir] = beaconkv.Engine(model_dir, max_batch=1)
    return _engines[model_dir]


def eviction_steps(trace: Trace, policy_cfg, engine=None) -> tuple[np.ndarray, int]:
    """The engine's evictions when it teacher-forces `trace.ids` under `policy_cfg`.

    Returns evicted_at [layers, kv_heads, T]: the decode step (= position) after whose step the
    engine evicted the position from the head (NEVER if kept to the end), and the first such
    step (NEVER if none). `engine`: a beaconkv.Engine of the trace's model (default: one for
    trace.model_dir); it must be idle."""
    if engine is None:
        if trace.model_dir is None:
            raise ValueError("eviction_steps: the trace has no model_dir; pass engine=")
        engine = replay_engine(trace.model_dir)
    evicted_at, first = engine.replay_evictions(trace.ids, trace.prompt_len, policy_cfg)
    return evicted_at, int(first)


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
    configs = policy_configs(policies, budget, interval, knobs, model_dir)
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
