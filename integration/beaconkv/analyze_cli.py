"""``beaconkv analyze``: the revisit analysis of a split, and optionally the policy replay.
The one entry point for both (beaconkv.revisit and beaconkv.replay are its libraries).

    beaconkv analyze --model DIR --split dev --out OUT [--num N] [--prefix testbed]
    beaconkv analyze --model DIR --split dev --out OUT --replay --budget 64 \\
        [--policies beacon snapkv ...] [--interval 16] [--knob n_beacons=8]

Writes the PNGs of beaconkv.revisit (distance histograms, layer x head map of global queries,
PCA of pre-RoPE queries), with --replay also replay_missed_mass.png (beaconkv.replay), and
OUT/summary.json:

* ``global_query_fraction``: share of output queries (all layers and heads) whose mean
  distance to their top-K attended positions exceeds threshold_frac x sequence length;
* ``revisit``: revisit.analyze's full summary;
* with --replay, ``replay.policies[P]``: ``missed_mass`` (overall), ``missed_mass_global``,
  ``missed_mass_local``, ``missed_mass_retrieval``, per layer, query counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings

DEFAULT_BUDGET = 64


def default_policies() -> list[str]:
    import beaconkv

    names = list(beaconkv.policy_names())
    return names[: names.index("beacon") + 1] + ["beacon-pooled"] + names[names.index("beacon") + 1:]


def _without_nan(obj):
    """NaN (e.g. a retrieval share over no retrieval query) -> None, so the file is strict
    JSON."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _without_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_without_nan(v) for v in obj]
    return obj


def _fmt(value, spec: str = ".4f") -> str:
    return "n/a" if value is None else format(value, spec)


def truncated_split(split_path: str, num: int, max_target_tokens: int, directory: str) -> str:
    """A .jsonl with the first `num` problems, targets cut to `max_target_tokens` (for quick
    runs). The cut never falls inside the plan: revisit.analyze locates the plan's end ('?')."""
    from . import task
    from .replay import truncate_record

    path = os.path.join(directory, "split.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for rec in task.read_split(split_path)[:num]:
            n = max_target_tokens
            if "?" in rec["target"]:
                n = max(n, rec["target"].index("?") + 2)
            f.write(json.dumps(truncate_record(rec, n)) + "\n")
    return path


def cmd_analyze(args: argparse.Namespace) -> int:
    from . import revisit
    from .evaluate import resolve_split

    split_path = resolve_split(args.model, args.split)
    policies = args.policies or default_policies()
    knobs = args.knob or []
    if args.replay:
        from .replay import policy_configs

        # A bad knob fails first.
        policy_configs(policies, args.budget, args.interval, knobs, args.model)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.max_target_tokens is not None:
            split_path = truncated_split(split_path, args.num, args.max_target_tokens, tmp)
        with warnings.catch_warnings():
            if args.max_target_tokens is not None:  # cut outputs may hold no retrieval token
                warnings.simplefilter("ignore", RuntimeWarning)
            res = revisit.analyze(args.model, split_path, args.num, k_max=args.k,
                                  threshold_frac=args.threshold_frac,
                                  check_greedy=not args.no_greedy_check)
            paths = revisit.plot(res, args.out, prefix=args.prefix)
        s = res["summary"]
        summary = {
            "model": args.model, "split": args.split, "problems": s["problems"],
            "global_query_fraction": s["global_frac_topk"],
            "global_query_fraction_weighted": s["global_frac_weighted"],
            "revisit": s,
        }
        if args.replay:
            from .replay import plot_replay, replay_split

            rep = replay_split(args.model, split_path, policies, budget=args.budget,
                               num=args.num, interval=args.interval, knobs=knobs, k_max=args.k,
                               threshold_frac=args.threshold_frac)
            summary["replay"] = rep
            paths.append(plot_replay(rep, args.out))
    out_json = os.path.join(args.out, "summary.json")
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(_without_nan(summary), f, indent=1, allow_nan=False)
        f.write("\n")
    print(f"problems={summary['problems']} "
          f"global_query_fraction={summary['global_query_fraction']:.4f}")
    for name, r in summary.get("replay", {}).get("policies", {}).items():
        print(f"  {name:14s} missed_mass={_fmt(r['missed_mass'])} "
              f"global={_fmt(r['missed_mass_global'])} local={_fmt(r['missed_mass_local'])} "
              f"retained={_fmt(r['mean_retained_tokens'], '.0f')}"
              f"/{_fmt(r['mean_full_tokens'], '.0f')} tokens")
    print("wrote", ", ".join(paths + [out_json]), file=sys.stderr)
    return 0


def add_analyze_parser(subparsers, default_model: str) -> argparse.ArgumentParser:
    from .validate import float_arg, int_arg, policy_help, split_help

    a = subparsers.add_parser("analyze", help="revisit analysis (+ policy replay) of a split")
    a.add_argument("--model", default=default_model, help="HF-style model directory")
    a.add_argument("--split", default="dev", help=split_help(default_model))
    a.add_argument("--out", required=True, help="output directory (PNGs + summary.json)")
    a.add_argument("--num", type=int_arg(1), default=8, help="first N problems")
    a.add_argument("--prefix", default="revisit",
                   help="file name prefix of the revisit PNGs (docs/ uses testbed)")
    a.add_argument("--k", type=int_arg(1), default=150, help="top-K for the mean distance")
    a.add_argument("--threshold-frac", type=float_arg(0.0, 1.0), default=0.15,
                   help="global query: distance above this fraction of the sequence length")
    a.add_argument("--no-greedy-check", action="store_true",
                   help="skip checking that greedy decoding reproduces the reference output")
    a.add_argument("--max-target-tokens", type=int_arg(1), default=None,
                   help="cut each reference output to this many tokens (quick runs)")
    a.add_argument("--replay", action="store_true",
                   help="replay each policy's evictions; report the missed revisit mass")
    a.add_argument("--policies", nargs="+", default=None,
                   help="policies to replay, each a " + policy_help() + " (default: every "
                        "policy, and beacon-pooled)")
    a.add_argument("--budget", type=int_arg(1), default=DEFAULT_BUDGET, help="KV tokens kept per head")
    a.add_argument("--interval", type=int_arg(1), default=None,
                   help="compression interval for every policy that has one (default: each "
                        "policy's own)")
    a.add_argument("--knob", action="append", metavar="NAME=VALUE",
                   help="policy knob override for every replayed policy (repeatable); each "
                        "policy must have it (per-policy knobs: --policies NAME:KNOB=VALUE)")
    a.set_defaults(func=cmd_analyze)
    return a
