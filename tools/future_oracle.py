"""How far an eviction policy could go: a cache that knows the future attention.

The BeaconKV target asks for near full-cache answers at about 8.5x less KV. This probe asks
whether that is reachable at all with the same schedule and budget, by giving the eviction the
one thing no real policy has: the attention every later query will pay. For each problem the
NumPy reference runs the target teacher forced with the full cache and records every query's
attention; then each (layer, kv head) is replayed on beacon's schedule (a head holding
budget + interval tokens drops back to budget), keeping the first n_sinks and the newest
n_recent positions (beacon's knobs, read from the core's config) and, of the rest, those with
the highest attention from any later query of the group (full-cache attention, max over query
heads and over all later steps). The same teacher-forced check as layer_eviction_probe.py
then counts the problems and tokens whose argmax differs from the target when every layer sees
only what the oracle kept, beside the same count for the full cache and the engine's policy
(Engine.replay_evictions) at the same budget, and, with --per-layer, for each layer L the
engine's evictions everywhere but L, where the oracle's are used (how much of the gap each
layer's predictions hold). A "hindsight" row ranks by the largest attention any query so far
paid each token in the full cache instead (what the past alone says, with nothing evicted).

    python3 tools/future_oracle.py --split dev --num 200 --budget 96 --interval 32
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layer_eviction_probe import NEVER, count_wrong, engine_bias, report  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def future_max(attention: np.ndarray) -> np.ndarray:
    """attention [group, T, T] (row t: query t's weights over positions) -> [T, T] whose row t
    is, per position, the largest weight any query after t in the group pays it (0 for t = T-1)."""
    per_step = attention.max(axis=0)  # [T, T]
    suffix = np.maximum.accumulate(per_step[::-1], axis=0)[::-1]  # row t: max over queries >= t
    out = np.zeros_like(per_step)
    out[:-1] = suffix[1:]
    return out


def past_max(attention: np.ndarray) -> np.ndarray:
    """attention [group, T, T] -> [T, T] whose row t is, per position, the largest weight any
    query up to and including t in the group paid it: hindsight, what an H2O-style policy that
    kept max scores over a full cache would know."""
    return np.maximum.accumulate(attention.max(axis=0), axis=0)


def oracle_evictions(future: np.ndarray, start: int, budget: int, interval: int, n_sinks: int,
                     n_recent: int) -> np.ndarray:
    """One head's evicted_at [T] (NEVER if kept to the end) under beacon's schedule with
    future-attention scores. future: [T, T] from future_max; the cache holds positions
    0..start-1 after the prompt and one more after each step t >= start (compressed after
    step t when it reaches budget + interval)."""
    t_len = future.shape[0]
    evicted_at = np.full(t_len, NEVER, dtype=np.int64)
    alive = list(range(start))
    for t in range(start, t_len):
        alive.append(t)
        if len(alive) < budget + interval:
            continue
        protect = set(alive[:n_sinks]) | set(alive[max(len(alive) - n_recent, 0):])
        rest = [p for p in alive if p not in protect]
        free = max(budget - len(protect), 0)
        order = sorted(rest, key=lambda p: (-future[t, p], -p))  # ties: the newer stays
        dropped = set(order[free:])
        evicted_at[list(dropped)] = t
        alive = [p for p in alive if p not in dropped]
    return evicted_at


def replay_ranked(attention: np.ndarray, score, group: int, start: int, cfg) -> np.ndarray:
    """attention [layers, heads, T, T] -> evicted_at [layers, kv_heads, T] when every head is
    replayed on cfg's schedule ranking by score (future_max or past_max of its group)."""
    layers, heads = attention.shape[:2]
    return np.stack([
        np.stack([oracle_evictions(score(attention[i, h * group:(h + 1) * group]), start,
                                   cfg.budget, cfg.interval, cfg.n_sinks, cfg.n_recent)
                  for h in range(heads // group)])
        for i in range(layers)])


def wrong_tokens(model, ids: list[int], prompt_len: int, evicted_at: np.ndarray,
                 counted: int = 0) -> int:
    """evicted_at [layers, kv_heads, T] -> teacher-forced argmax mismatches over the target,
    the first `counted` layers attending with the count bias as the engine does."""
    bias = [engine_bias(evicted_at[i], ids, i < counted) for i in range(evicted_at.shape[0])]
    return count_wrong(model.forward(ids, bias), ids, prompt_len)


def run(model_dir: str, split: str, num: int | None, budget: int, interval: int,
        knobs: dict | None = None, per_layer: bool = False) -> dict:
    import beaconkv
    from beaconkv.evaluate import load_problems
    from beaconkv.reference import Model
    from beaconkv.replay import policy_configs, replay_engine

    model = Model(model_dir)
    tok = model.tokenizer
    c = model.config
    group = c.num_attention_heads // c.num_key_value_heads
    # The core's config, with the knobs applied, gives both rows their schedule and protection.
    cfg = policy_configs(["beacon"], budget, interval, knobs, model_dir)["beacon"]
    if cfg.protect_prompt or cfg.budget_mode != "uniform":
        raise ValueError("future oracle: only uniform budgets with n_sinks protection "
                         "(protect_prompt=0, budget_mode=uniform)")
    counted = beaconkv.count_bias_layers(cfg)  # layers whose attention the engine biases
    engine = replay_engine(model_dir)
    names = ["full cache", "beacon", "future oracle", "hindsight"]
    if per_layer:
        names += [f"oracle in layer {i} only" for i in range(c.num_hidden_layers)]
    counts = {name: {"problems": 0, "tokens": 0} for name in names}
    records = load_problems(model_dir, split, num)
    for rec in records:
        prompt = model.encode_prompt(rec["prompt"])
        ids = prompt + tok.encode(rec["target"]) + [tok.eos_id]
        logits, attention, _ = model.trace(ids)  # attention [layers, heads, T, T]
        oracle = replay_ranked(attention, future_max, group, len(prompt), cfg)
        engine_evicted, _ = engine.replay_evictions(ids, len(prompt), cfg)
        engine_evicted = np.asarray(engine_evicted)
        variants = [("beacon", engine_evicted), ("future oracle", oracle),
                    ("hindsight", replay_ranked(attention, past_max, group, len(prompt), cfg))]
        if per_layer:
            for i in range(c.num_hidden_layers):
                mixed = engine_evicted.copy()
                mixed[i] = oracle[i]
                variants.append((f"oracle in layer {i} only", mixed))
        results = [("full cache", count_wrong(logits, ids, len(prompt)))]
        results += [(name, wrong_tokens(model, ids, len(prompt), ev, counted))
                    for name, ev in variants]
        for name, wrong in results:
            counts[name]["problems"] += wrong > 0
            counts[name]["tokens"] += wrong
    return {"split": split, "num_problems": len(records), "budget": budget, "interval": interval,
            "n_sinks": cfg.n_sinks, "n_recent": cfg.n_recent, "knobs": knobs,
            "variants": [{"name": n, "problems_with_wrong_tokens": v["problems"],
                          "wrong_tokens": v["tokens"]} for n, v in counts.items()]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--split", default="dev")
    ap.add_argument("--num", type=int, default=None, help="first N problems (default: all)")
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--interval", type=int, required=True)
    ap.add_argument("--knob", action="append", default=[], metavar="K=V",
                    help="beacon knob (repeatable); n_recent and n_sinks set the protection of "
                         "both rows")
    ap.add_argument("--per-layer", action="store_true",
                    help="also the oracle in one layer at a time, the engine's evictions elsewhere")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args(argv)
    knobs = dict(k.split("=", 1) for k in args.knob) or None
    result = run(args.model, args.split, args.num, args.budget, args.interval, knobs,
                 args.per_layer)
    report(result, f"budget {args.budget} / interval {args.interval}", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
