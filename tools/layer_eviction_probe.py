"""Which layers' evictions change the model's output: teacher-forced probes.

For each problem the engine replays the policy teacher forced (`Engine.replay_evictions`, the
record error_attribution.py uses), then the NumPy reference runs the same tokens with each
chosen layer seeing exactly the positions the engine still held for its kv head at each query
(every other layer sees everything). Counts the problems and tokens whose argmax differs from
the target. Variants: every layer at once, each layer alone, and, with --log-gap-bias, the
same for layer 0 with each kept token's logit raised by log(the gap to the next kept position),
so that a kept token stands for the positions evicted behind it (an importance weight for
layer 0's evenly spaced sample). With --oracle L, layer L alone is probed again with one
region always visible whatever the engine evicted (the prompt, the plan: the target's lines up
to the answer line's `?`, or every newline), to tell which kept tokens that layer lacks.

    python3 tools/layer_eviction_probe.py --split dev --num 200 --policy beacon --budget 112 \\
        --interval 16 --log-gap-bias
    python3 tools/layer_eviction_probe.py --split dev --num 200 --budget 96 --interval 32 \\
        --oracle 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def visibility_bias(evicted_at: np.ndarray, log_gap: bool = False) -> np.ndarray:
    """evicted_at [kv_heads, T] (the step after which the engine evicted each position; NEVER or
    any value >= T if never) -> additive bias [kv_heads, T, T]: 0 where query t sees position p
    (p <= t and not evicted before step t), -inf elsewhere; with log_gap, log(q - p) for a visible p
    whose next visible position (or t + 1) is q."""
    kv, t_len = evicted_at.shape
    q = np.arange(t_len)
    visible = (evicted_at[:, None, :] >= q[None, :, None]) & (q[None, None, :] <= q[None, :, None])
    bias = np.where(visible, 0.0, -np.inf).astype(np.float32)
    if log_gap:
        for h in range(kv):
            for t in range(t_len):
                cols = np.nonzero(visible[h, t])[0]
                bias[h, t, cols] = np.log(np.diff(np.append(cols, t + 1)).astype(np.float32))
    return bias


def count_bias(bias: np.ndarray, ids) -> np.ndarray:
    """A visibility bias [kv_heads, T, T] (visibility_bias, no log gap) plus the count bias of
    the engine's attention (beacon `count_bias`, docs/policies.md): log(N / K) on each visible
    position p of query t, N the positions <= t holding p's token id and K the visible ones."""
    out = bias.copy()
    ids = np.asarray(ids)
    vocab = int(ids.max()) + 1
    for h in range(out.shape[0]):
        for t in range(out.shape[1]):
            seen = np.nonzero(np.isfinite(out[h, t]))[0]
            n = np.bincount(ids[:t + 1], minlength=vocab)
            k = np.bincount(ids[seen], minlength=vocab)
            out[h, t, seen] = np.log(n[ids[seen]] / k[ids[seen]])
    return out


def engine_bias(evicted_at: np.ndarray, ids, counted: bool, log_gap: bool = False) -> np.ndarray:
    """The additive attention bias of one layer as the engine attends: visibility_bias, plus the
    count bias when the layer is one of the policy's count-bias layers (`counted`:
    layer < beaconkv.count_bias_layers(cfg)) and no log gap is asked for."""
    bias = visibility_bias(evicted_at, log_gap)
    return count_bias(bias, ids) if counted and not log_gap else bias


NEVER = 1 << 30  # evicted_at of a position the engine kept to the end


def count_wrong(logits: np.ndarray, ids: list[int], prompt_len: int) -> int:
    """Teacher-forced tokens of ids after the prompt whose argmax in logits [T, vocab] differs."""
    return int((logits[prompt_len - 1:-1].argmax(-1) != np.asarray(ids[prompt_len:])).sum())


def oracle_regions(ids: list[int], prompt_len: int, target: str, newline_id: int) -> dict:
    """Boolean masks [T] over the sequence's positions: "prompt", "plan" (the target's text up to
    and including the newline after its first `?`, the plan task's answer line; absent when
    the target has no `?`) and "newlines"."""
    t_len = len(ids)
    pos = np.arange(t_len)
    regions = {"prompt": pos < prompt_len}
    mark = target.find("?")
    if mark >= 0:  # one token per character after the prompt
        regions["plan"] = (pos >= prompt_len) & (pos < prompt_len + mark + 2)
    regions["newlines"] = np.asarray(ids) == newline_id
    return regions


def keep_visible(evicted_at: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """evicted_at [kv_heads, T] with the positions in mask [T] never evicted."""
    out = evicted_at.copy()
    out[:, mask] = NEVER
    return out


def run(model_dir: str, split: str, num: int | None, policy: str, budget: int | None,
        interval: int | None, knobs: dict | None, log_gap_bias: bool,
        oracle_layer: int | None = None) -> dict:
    from beaconkv.evaluate import load_problems
    from beaconkv.reference import Model
    from beaconkv.replay import policy_configs, replay_engine

    import beaconkv

    model = Model(model_dir)
    tok = model.tokenizer
    n_layers = model.config.num_hidden_layers
    cfg = policy_configs([policy], budget, interval, knobs, model_dir)[policy]
    counted = beaconkv.count_bias_layers(cfg)  # layers whose attention the engine biases
    engine = replay_engine(model_dir)
    if oracle_layer is not None and not 0 <= oracle_layer < n_layers:
        raise ValueError(f"--oracle: layer {oracle_layer} is not in 0..{n_layers - 1}")
    # name -> (layers that see the engine's evictions, layers with the log-gap bias, region
    # the oracle layer always sees)
    variants = {"all layers": (tuple(range(n_layers)), (), None)}
    variants.update({f"layer {i} alone": ((i,), (), None) for i in range(n_layers)})
    if log_gap_bias:
        variants["all layers, layer 0 log-gap bias"] = (tuple(range(n_layers)), (0,), None)
        variants["layer 0 alone, log-gap bias"] = ((0,), (0,), None)
    if oracle_layer is not None:
        for region in ("prompt", "plan", "newlines"):
            variants[f"layer {oracle_layer} alone, {region} kept"] = ((oracle_layer,), (), region)
    problems = {name: 0 for name in variants}
    tokens = {name: 0 for name in variants}
    records = load_problems(model_dir, split, num)
    for rec in records:
        prompt = model.encode_prompt(rec["prompt"])
        ids = prompt + tok.encode(rec["target"]) + [tok.eos_id]
        evicted_at, _ = engine.replay_evictions(ids, len(prompt), cfg)
        evicted_at = np.asarray(evicted_at)
        regions = oracle_regions(ids, len(prompt), rec["target"], tok.encode("\n")[0])
        for name, (masked, biased, region) in variants.items():
            if region is not None and region not in regions:
                continue  # a target without a plan
            seen = [keep_visible(evicted_at[i], regions[region]) if region else evicted_at[i]
                    for i in range(n_layers)]
            bias = [engine_bias(seen[i], ids, i < counted, i in biased) if i in masked else None
                    for i in range(n_layers)]
            wrong = count_wrong(model.forward(ids, bias), ids, len(prompt))
            problems[name] += wrong > 0
            tokens[name] += wrong
    return {"policy": policy, "budget": budget, "interval": interval, "knobs": knobs,
            "split": split, "num_problems": len(records),
            "variants": [{"name": n, "problems_with_wrong_tokens": problems[n],
                          "wrong_tokens": tokens[n]} for n in variants]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--split", default="dev")
    ap.add_argument("--num", type=int, default=None, help="first N problems (default: all)")
    ap.add_argument("--policy", default="beacon")
    ap.add_argument("--budget", type=int, default=112)
    ap.add_argument("--interval", type=int, default=16)
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--log-gap-bias", action="store_true",
                    help="also probe layer 0 with each kept token weighted by its gap")
    ap.add_argument("--oracle", type=int, metavar="LAYER",
                    help="also probe LAYER alone with the prompt, the plan or every newline kept")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    knobs = dict(k.split("=", 1) for k in args.knob) or None
    result = run(args.model, args.split, args.num, args.policy, args.budget, args.interval, knobs,
                 args.log_gap_bias, args.oracle)
    report(result, f"{args.policy} {args.budget} / {args.interval}", args.json)
    return 0


def report(result: dict, title: str, json_path: str | None) -> None:
    """Prints a run's variants (problems and tokens wrong) and writes it to json_path if given."""
    print(f"{result['split']} {result['num_problems']} problems, {title}, teacher forced:")
    for v in result["variants"]:
        print(f"  {v['name']:34s} {v['problems_with_wrong_tokens']:4d} problems with a wrong "
              f"token, {v['wrong_tokens']} wrong tokens")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
