"""Which layers' evictions change the model's output: teacher-forced probes.

For each problem the engine replays the policy teacher forced (`Engine.replay_evictions`, the
record error_attribution.py uses), then the NumPy reference runs the same tokens with each
chosen layer seeing exactly the positions the engine still held for its kv head at each query
(every other layer sees everything). Counts the problems and tokens whose argmax differs from
the target. Variants: every layer at once, each layer alone, and, with --log-gap-bias, the
same for layer 0 with each kept token's logit raised by log(the gap to the next kept position),
so that a kept token stands for the positions evicted behind it (an importance weight for
layer 0's evenly spaced sample).

    python3 tools/layer_eviction_probe.py --split dev --num 200 --policy beacon --budget 112 \\
        --interval 16 --log-gap-bias
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def visibility_bias(evicted_at: np.ndarray, log_gap: bool = False) -> np.ndarray:
    """evicted_at [kv_heads, T] (the step after which the engine evicted each position; a large
    value if never) -> additive bias [kv_heads, T, T]: 0 where query t sees position p (p <= t
    and not evicted before step t), -inf elsewhere; with log_gap, log(q - p) for a visible p
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


def run(model_dir: str, split: str, num: int | None, policy: str, budget: int | None,
        interval: int | None, knobs: dict | None, log_gap_bias: bool) -> dict:
    from beaconkv.evaluate import load_problems
    from beaconkv.reference import Model
    from beaconkv.replay import policy_configs, replay_engine

    model = Model(model_dir)
    tok = model.tokenizer
    n_layers = model.config.num_hidden_layers
    cfg = policy_configs([policy], budget, interval, knobs)[policy]
    engine = replay_engine(model_dir)
    # name -> (layers that see the engine's evictions, layers with the log-gap bias)
    variants = {"all layers": (tuple(range(n_layers)), ())}
    variants.update({f"layer {i} alone": ((i,), ()) for i in range(n_layers)})
    if log_gap_bias:
        variants["all layers, layer 0 log-gap bias"] = (tuple(range(n_layers)), (0,))
        variants["layer 0 alone, log-gap bias"] = ((0,), (0,))
    problems = {name: 0 for name in variants}
    tokens = {name: 0 for name in variants}
    records = load_problems(model_dir, split, num)
    for rec in records:
        prompt = model.encode_prompt(rec["prompt"])
        ids = prompt + tok.encode(rec["target"]) + [tok.eos_id]
        target = np.asarray(ids[len(prompt):])
        evicted_at, _ = engine.replay_evictions(ids, len(prompt), cfg)
        evicted_at = np.asarray(evicted_at)
        for name, (masked, biased) in variants.items():
            bias = [visibility_bias(evicted_at[i], i in biased) if i in masked else None
                    for i in range(n_layers)]
            logits = model.forward(ids, bias)
            wrong = int((logits[len(prompt) - 1:-1].argmax(-1) != target).sum())
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
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    knobs = dict(k.split("=", 1) for k in args.knob) or None
    result = run(args.model, args.split, args.num, args.policy, args.budget, args.interval, knobs,
                 args.log_gap_bias)
    print(f"{result['split']} {result['num_problems']} problems, {args.policy} "
          f"{args.budget} / {args.interval}, teacher forced:")
    for v in result["variants"]:
        print(f"  {v['name']:34s} {v['problems_with_wrong_tokens']:4d} problems with a wrong "
              f"token, {v['wrong_tokens']} wrong tokens")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
