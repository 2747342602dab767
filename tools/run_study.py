#!/usr/bin/env python3
"""The accuracy-under-compression study (issue 6): every policy x budget, greedy and
teacher-forced, one JSON per run under docs/results/.

    python3 tools/run_study.py                                  # the whole grid on `test`
    python3 tools/run_study.py --split dev --num 8 --budgets 64 128 --policies beacon snapkv
    nohup python3 tools/run_study.py --skip-existing > study.log 2>&1 &   # resumable

File names: ``<policy>_b<budget>.json`` (greedy, beaconkv.evaluate.evaluate) and
``<policy>_b<budget>_tf.json`` (teacher forced, evaluate_teacher_forced); ``full.json`` and
``full_tf.json`` once, since full ignores the budget. ``<policy>-pooled`` runs the policy
with pooled budgets (beacon, snapkv); ``<policy>:knob=value,...`` a variant with its own knobs
(``beacon:n_recent=32`` -> ``beacon__n_recent-32_b64.json``). The core's registry builds every
configuration (``beaconkv.make_policy_config``, as ``beaconkv eval`` does): rpc at budget B
runs with period = ratio x B, so its first round keeps B tokens; a --knob that a policy of the
grid does not have is an error (give per-policy knobs in the spec instead).

Each file holds what ``beaconkv eval --json`` writes plus ``variant`` (the policy as named
here), ``study_budget``, ``mode`` (greedy / teacher_forced) and ``split``.
Then ``python3 tools/make_results.py`` writes the table and the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEFAULT_BUDGETS = [32, 64, 128, 256]
MODES = ("greedy", "tf")


def default_policies() -> list[str]:
    from beaconkv.analyze_cli import default_policies as names

    return names()


def result_name(spec: str, budget: int | None, mode: str) -> str:
    """'beacon:n_recent=32,pool_kernel=3' at 64 -> 'beacon__n_recent-32__pool_kernel-3_b64'."""
    safe = spec.replace(":", "__").replace(",", "__").replace("=", "-").replace("/", "_")
    base = safe if spec == "full" or budget is None else f"{safe}_b{budget}"
    return base + ("_tf" if mode == "tf" else "") + ".json"


def plan(policies: list[str], budgets: list[int], modes: list[str]) -> list[tuple]:
    """(spec, budget or None, mode) of every run, full once per mode, in a fixed order."""
    runs = []
    for mode in modes:
        for spec in policies:
            for budget in ([None] if spec == "full" else budgets):
                runs.append((spec, budget, mode))
    return runs


_FULL_TF: dict = {}  # the full-cache teacher-forced run, shared by every policy of the grid


def run_one(args: argparse.Namespace, spec: str, budget: int | None, mode: str) -> dict:
    from beaconkv.evaluate import evaluate, evaluate_teacher_forced

    kw = dict(num=args.num, max_batch=args.max_batch, progress=sys.stderr,
              policy_knobs=args.knob, interval=args.interval)
    if mode == "tf":
        r = evaluate_teacher_forced(args.model, args.split, spec, budget, full_cache=_FULL_TF,
                                    **kw)
    else:
        r = evaluate(args.model, args.split, spec, budget, **kw).as_dict()
    r.update(variant=spec, study_budget=budget,
             mode="teacher_forced" if mode == "tf" else "greedy", split=args.split)
    return r


def write_json(path: str, data: dict) -> None:
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # a reader never sees a half-written result


def main(argv: list[str] | None = None) -> int:
    from beaconkv.validate import split_help

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"),
                   help="HF-style model directory")
    p.add_argument("--split", default="test",
                   help=split_help(os.path.join(ROOT, "models", "tiny-reasoner")))
    p.add_argument("--num", type=int, default=None, help="first N problems (default: all)")
    p.add_argument("--budgets", type=int, nargs="+", default=DEFAULT_BUDGETS,
                   help="KV tokens kept per head, one run per budget")
    p.add_argument("--policies", nargs="+", default=None,
                   help="policy names, '<name>-pooled' for pooled budgets (default: all)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="greedy (exact answers) and/or tf (teacher forced)")
    p.add_argument("--interval", type=int, default=None,
                   help="compression interval for every policy that has one (default: each "
                        "policy's own)")
    p.add_argument("--knob", action="append", metavar="NAME=VALUE",
                   help="policy knob override for every policy of the grid (repeatable); "
                        "each policy must have it")
    p.add_argument("--max-batch", type=int, default=16, help="most sequences running at once")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results"),
                   help="directory of the result JSON files")
    p.add_argument("--skip-existing", action="store_true",
                   help="leave runs whose JSON already exists (resume an interrupted study)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    args = p.parse_args(argv)

    runs = plan(args.policies or default_policies(), args.budgets, args.modes)
    os.makedirs(args.out, exist_ok=True)
    failures = 0
    for i, (spec, budget, mode) in enumerate(runs, 1):
        path = os.path.join(args.out, result_name(spec, budget, mode))
        tag = f"[{i}/{len(runs)}] {os.path.basename(path)}"
        if args.dry_run:
            print(tag)
            continue
        if args.skip_existing and os.path.exists(path):
            print(f"{tag}: exists, skipped", flush=True)
            continue
        start = time.perf_counter()
        try:
            r = run_one(args, spec, budget, mode)
        except (ValueError, RuntimeError, MemoryError) as e:
            failures += 1
            print(f"{tag}: FAILED: {e}", flush=True)
            continue
        write_json(path, r)
        line = (f"{tag}: accuracy={r['accuracy']:.3f} compression={r['compression_ratio']:.2f}x "
                f"mean_generated={r['mean_generated_tokens']:.0f}")
        if mode == "tf":
            line += (f" agreement={r['token_agreement']:.4f} "
                     f"retrieval={r['retrieval_accuracy']:.4f}")
        print(f"{line} ({time.perf_counter() - start:.1f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
