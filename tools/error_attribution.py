#!/usr/bin/env python3
"""Which evicted tokens did a policy's wrong tokens need? (issue 6: "find out why from the traces")

For each problem, the engine runs the policy teacher forced on the reference output and the
positions where the policy's argmax differs from the reference token are the errors. For the
problems with errors, the NumPy reference records the full-cache trace, the engine replays the
same teacher-forced run and reports when it evicted each position from each head
(beaconkv.replay.eviction_steps), and each error query's full-cache attention is split per
(layer, query head) into the mass on tokens the head had already evicted. Heads
with missed mass >= --min-mass are listed with their most-attended evicted tokens: distance
back, token, the generator's role letter of that token (prompt tokens have none), attention
weight, and the token's age when it was evicted.

    python3 tools/error_attribution.py --split dev --num 64 --policy beacon --budget 128 \\
        --interval 32 [--knob n_recent=64] [--json OUT]

The eviction history is the engine's own in that run (the same tokens teacher forced); only
the attention it is weighed with is the full cache's.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def attribute(trace, evicted_at: np.ndarray, query_positions, decode, min_mass: float = 0.1,
              top: int = 3) -> list[dict]:
    """Per query position t (predicting token t + 1): heads whose full-cache attention put at
    least `min_mass` on positions their kv head had evicted before step t, each with its `top`
    most-attended evicted positions. `decode` maps a token id to text."""
    n_layers, n_heads = trace.attention.shape[:2]
    group = n_heads // evicted_at.shape[1]
    p_len = trace.prompt_len
    out = []
    for t in query_positions:
        heads = []
        for layer in range(n_layers):
            for h in range(n_heads):
                row = trace.attention[layer, h, t, : t + 1]
                gone = np.nonzero(evicted_at[layer, h // group, : t + 1] < t)[0]
                mass = float(row[gone].sum())
                if not len(gone) or mass < min_mass:
                    continue
                best = gone[np.argsort(-row[gone], kind="stable")[:top]]
                heads.append({"layer": layer, "head": h, "missed_mass": mass, "tokens": [
                    {"distance": int(t - k), "token": decode(trace.ids[k]),
                     "role": (str(trace.roles[k - p_len]) if trace.roles is not None
                              and k >= p_len else ""),
                     "weight": float(row[k]),
                     "evicted_at_age": int(evicted_at[layer, h // group, k] - k)}
                    for k in best]})
        out.append({"query_position": int(t), "heads": heads})
    return out


def run(model_dir: str, split: str, policy: str, budget: int | None, interval: int | None,
        knobs: dict | list, num: int | None, min_mass: float = 0.1, top: int = 3,
        max_errors: int = 3, problems: list[dict] | None = None) -> dict:
    from beaconkv.evaluate import _forced_run, load_problems
    from beaconkv.reference import Model
    from beaconkv.replay import eviction_steps, policy_configs, record_trace
    from beaconkv.tokenizer import CharTokenizer

    if problems is None:
        problems = load_problems(model_dir, split, num)
    tok = CharTokenizer.load(model_dir)
    cfg = policy_configs([policy], budget, interval, knobs, model_dir)[policy]
    outs, _, _ = _forced_run(model_dir, problems, tok, cfg, 16, 16, 0, "recompute", None,
                             policy)
    model = Model(model_dir)
    decode = lambda i: tok.decode([int(i)])  # noqa: E731
    errors, roles = [], collections.Counter()
    for i, p in enumerate(problems):
        target = np.asarray(tok.encode(p["target"]) + [tok.eos_id])
        got = outs[i]["logits"].argmax(-1)
        bad = np.nonzero(got != target)[0]
        if not len(bad):
            continue
        tr = record_trace(model, p)
        evicted_at, _ = eviction_steps(tr, cfg)
        p_roles = p.get("roles", "") + "E"  # the last target is end-of-sequence
        for b in bad:
            roles[p_roles[b] if b < len(p_roles) else "?"] += 1
        shown = bad[:max_errors]
        for b, att in zip(shown, attribute(tr, evicted_at, [tr.prompt_len - 1 + b for b in shown],
                                           decode, min_mass, top)):
            errors.append({"problem": i, "target_index": int(b),
                           "role": p_roles[b] if b < len(p_roles) else "?",
                           "wanted": decode(target[b]), "got": decode(got[b]), **att})
    return {"policy": policy, "budget": budget, "interval": interval, "knobs": knobs,
            "num_problems": len(problems),
            "problems_with_errors": len({e["problem"] for e in errors}),
            "wrong_tokens_by_role": dict(roles), "errors": errors}


def render(result: dict) -> str:
    lines = [f"{result['policy']} budget {result['budget']} interval {result['interval']}: "
             f"{result['problems_with_errors']}/{result['num_problems']} problems with wrong "
             f"tokens; wrong tokens by role {result['wrong_tokens_by_role']}"]
    for e in result["errors"]:
        lines.append(f"problem {e['problem']} target {e['target_index']} role {e['role']}: "
                     f"wanted {e['wanted']!r} got {e['got']!r}")
        for h in e["heads"]:
            toks = ", ".join(f"{k['distance']} back {k['token']!r}/{k['role'] or '-'} "
                             f"w {k['weight']:.2f} (evicted at age {k['evicted_at_age']})"
                             for k in h["tokens"])
            lines.append(f"  L{h['layer']}H{h['head']} missed {h['missed_mass']:.2f}: {toks}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from beaconkv.validate import knob_help, policy_help, split_help

    model = os.path.join(ROOT, "models", "tiny-reasoner")
    ap.add_argument("--model", default=model, help="HF-style model directory")
    ap.add_argument("--split", default="dev", help=split_help(model))
    ap.add_argument("--num", type=int, default=64, help="first N problems")
    ap.add_argument("--policy", default="beacon", help=policy_help())
    ap.add_argument("--budget", type=int, default=128, help="KV tokens kept per head")
    ap.add_argument("--interval", type=int, default=32,
                    help="compression interval (for the policies that have one)")
    ap.add_argument("--knob", action="append", metavar="NAME=VALUE", help=knob_help())
    ap.add_argument("--min-mass", type=float, default=0.1,
                    help="list a head when at least this share of its attention fell on "
                         "tokens it had evicted")
    ap.add_argument("--top", type=int, default=3, help="evicted tokens listed per head")
    ap.add_argument("--max-errors", type=int, default=3, help="errors shown per problem")
    ap.add_argument("--json", help="write the result as JSON here")
    args = ap.parse_args(argv)
    result = run(args.model, args.split, args.policy, args.budget, args.interval,
                 args.knob or [], args.num, args.min_mass, args.top, args.max_errors)
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
