"""Per-layer budgets for a model, found on its tuning splits: `layer_budget_offsets` by rule.

Beacon's budget is the same in every layer unless `layer_budget_offsets` moves tokens between
them, and which layers can give is the model's own (docs/results/accuracy.md, "Per-layer
budgets"). This tool finds them the way they were first found by hand, for any model the
NumPy reference runs:

1. Evaluate beacon (uniform budgets, --knob extras) on each tuning split and keep the
   problems it answers wrong.
2. Run the future oracle (tools/future_oracle.py, --per-layer) on a sample of them: for each
   layer, how many of the sampled failures the oracle in that layer alone repairs. Scaled to
   each split's failures and summed, that is the layer's need.
3. Candidates at each step size S: the pair move (S tokens per head from the layer with the
   least need to the one with the most) and the proportional move (each layer's offset
   proportional to its need's distance from the mean, the largest S, in multiples of
   --quantum, summing to 0).
4. Evaluate every candidate on every split with --eval-policy (beacon, or beacon-pooled for
   pooled budgets) and keep the best mean accuracy (no offsets when nothing beats them).

Tuning splits only: check the result once on held-out splits afterwards.

    python3 tools/calibrate_layer_budgets.py --model models/tiny-reasoner-2task \\
        --split dev2-61403.jsonl@32 --split defuse12-dev@16 --budget 96 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def pair_offsets(need: list[float], step: int) -> list[int]:
    """`step` tokens per head from the layer with the least need to the one with the most
    (ties to the earlier layer); all zero when every layer needs the same."""
    donor = min(range(len(need)), key=lambda i: need[i])
    taker = max(range(len(need)), key=lambda i: need[i])
    out = [0] * len(need)
    if need[donor] == need[taker]:
        return out
    out[donor], out[taker] = -step, step
    return out


def proportional_offsets(need: list[float], step: int, quantum: int) -> list[int]:
    """Offsets proportional to each layer's need minus the mean need, the largest magnitude
    `step`, rounded to multiples of `quantum` and summing to 0 (the entries rounded furthest
    from their exact value move by one quantum until they do)."""
    if step % quantum:
        raise ValueError(f"step {step} is not a multiple of the quantum {quantum}")
    mean = sum(need) / len(need)
    dev = [n - mean for n in need]
    top = max(abs(d) for d in dev)
    if top == 0:
        return [0] * len(need)
    exact = [d / top * step for d in dev]
    out = [quantum * round(x / quantum) for x in exact]
    while sum(out) != 0:
        sign = -1 if sum(out) > 0 else 1
        i = max(range(len(out)), key=lambda j: (exact[j] - out[j]) * sign)
        out[i] += sign * quantum
    return out


def candidates(need: list[float], steps: list[int], quantum: int) -> list[list[int]]:
    """The pair and proportional moves at every step, without repeats or all-zero ones."""
    out: list[list[int]] = []
    for step in steps:
        for offsets in (pair_offsets(need, step), proportional_offsets(need, step, quantum)):
            if any(offsets) and offsets not in out:
                out.append(offsets)
    return out


def knob_text(offsets: list[int]) -> str:
    return "/".join(str(o) for o in offsets)


def parse_split(spec: str, default_interval: int) -> tuple[str, int]:
    """SPLIT[@INTERVAL] -> (split, interval); a suffix that is not a number is part of the
    split's name (a path may hold '@')."""
    split, sep, interval = spec.rpartition("@")
    if not sep or not interval.isdigit():
        return spec, default_interval
    if int(interval) < 1 or not split:
        raise ValueError(f"split {spec!r}: needs a split before '@' and an interval >= 1")
    return split, int(interval)


def evaluate_split(model: str, split: str, budget: int, interval: int, knobs: dict,
                   num: int | None, policy: str = "beacon") -> tuple[float, int, list[dict]]:
    """(accuracy, problems, the problems answered wrong) of `policy` on one split."""
    from beaconkv.evaluate import evaluate

    fails: list[dict] = []
    r = evaluate(model, split, policy, budget, num=num, interval=interval,
                 policy_knobs=knobs or None,
                 on_output=lambda p, o: None if o["correct"] else fails.append(p))
    return r.accuracy, r.num_problems, fails


def layer_repairs(model: str, fails: list[dict], budget: int, interval: int, knobs: dict,
                  sample: int, seed: int) -> tuple[list[int], int]:
    """(per layer, how many of a sample of `fails` the oracle in that layer alone repairs;
    the sample's size)."""
    import future_oracle

    chosen = random.Random(seed).sample(fails, min(sample, len(fails)))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fails.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for p in chosen:
                f.write(json.dumps(p) + "\n")
        result = future_oracle.run(model, path, None, budget, interval, dict(knobs) or None,
                                   per_layer=True)
    wrong = {v["name"]: v["problems_with_wrong_tokens"] for v in result["variants"]}
    base = wrong["beacon"]
    layers = sorted(int(n.split()[3]) for n in wrong if n.startswith("oracle in layer"))
    return [base - wrong[f"oracle in layer {i} only"] for i in layers], len(chosen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--split", action="append", required=True, metavar="SPLIT[@INTERVAL]",
                    help="tuning split (name or .jsonl), repeatable; @INTERVAL overrides "
                         "--interval for it")
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--interval", type=int, default=32)
    ap.add_argument("--num", type=int, default=None, help="first N problems of each split")
    ap.add_argument("--knob", action="append", default=[], metavar="K=V",
                    help="other beacon knobs, kept in every run (repeatable)")
    ap.add_argument("--oracle-sample", type=int, default=60,
                    help="failures per split the oracle replays (default 60)")
    ap.add_argument("--steps", default="8,16,24", help="offset sizes to try (default 8,16,24)")
    ap.add_argument("--quantum", type=int, default=8,
                    help="offsets are multiples of this (default 8, the pool's block)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the oracle's sample")
    ap.add_argument("--eval-policy", choices=["beacon", "beacon-pooled"], default="beacon",
                    help="the policy the candidates are judged with (the oracle replays uniform "
                         "budgets either way; default beacon)")
    ap.add_argument("--json", help="write the runs and the choice here")
    a = ap.parse_args(argv)
    knobs = dict(k.split("=", 1) for k in a.knob)
    if "layer_budget_offsets" in knobs:
        ap.error("--knob layer_budget_offsets: that is what this tool finds")
    try:
        splits = [parse_split(s, a.interval) for s in a.split]
        steps = [int(s) for s in a.steps.split(",")]
    except ValueError as e:
        ap.error(str(e))

    report: dict = {"model": a.model, "budget": a.budget, "knobs": knobs,
                    "eval_policy": a.eval_policy, "splits": [],
                    "candidates": []}
    need: list[float] | None = None
    base_acc = []
    for split, interval in splits:
        acc, n, fails = evaluate_split(a.model, split, a.budget, interval, knobs, a.num)
        uniform_acc = acc
        if a.eval_policy != "beacon":  # the baseline the candidates must beat
            acc = evaluate_split(a.model, split, a.budget, interval, knobs, a.num,
                                 a.eval_policy)[0]
        base_acc.append(acc)
        entry = {"split": split, "interval": interval, "problems": n, "accuracy": acc,
                 "uniform_accuracy": uniform_acc, "failures": len(fails)}
        if fails:
            repairs, sampled = layer_repairs(a.model, fails, a.budget, interval, knobs,
                                             a.oracle_sample, a.seed)
            entry.update(oracle_sample=sampled, repairs_per_layer=repairs)
            scaled = [r / sampled * len(fails) for r in repairs]
            need = scaled if need is None else [x + y for x, y in zip(need, scaled)]
        report["splits"].append(entry)
        print(f"{split} @ {interval}: {a.eval_policy} {acc:.3f} (uniform: {len(fails)} of {n} "
              f"wrong)"
              + (f"; the oracle in one layer repairs {entry['repairs_per_layer']} of "
                 f"{entry['oracle_sample']} sampled" if fails else ""), flush=True)
    best = {"offsets": None, "mean_accuracy": sum(base_acc) / len(base_acc)}
    if need is None:
        print("no failures on any split: nothing to calibrate")
    else:
        report["need_per_layer"] = need
        print(f"need per layer (oracle repairs scaled to each split's failures): "
              f"{[round(x, 1) for x in need]}")
        for offsets in candidates(need, steps, a.quantum):
            run_knobs = dict(knobs, layer_budget_offsets=knob_text(offsets))
            try:
                accs = [evaluate_split(a.model, s, a.budget, i, run_knobs, a.num,
                                       a.eval_policy)[0] for s, i in splits]
            except ValueError as e:  # e.g. a layer pushed below n_recent + n_sinks
                print(f"  {knob_text(offsets):>16}: skipped ({e})")
                continue
            mean = sum(accs) / len(accs)
            report["candidates"].append({"offsets": offsets, "accuracy": accs,
                                         "mean_accuracy": mean})
            print(f"  {knob_text(offsets):>16}: " + " ".join(f"{x:.3f}" for x in accs)
                  + f" (mean {mean:.3f})", flush=True)
            if mean > best["mean_accuracy"]:
                best = {"offsets": offsets, "mean_accuracy": mean}
    report["choice"] = best
    if best["offsets"] is None:
        print(f"keep equal layer budgets (mean {best['mean_accuracy']:.3f})")
    else:
        print(f"choice: --knob layer_budget_offsets={knob_text(best['offsets'])} "
              f"(mean {best['mean_accuracy']:.3f} against no offsets "
              f"{sum(base_acc) / len(base_acc):.3f})")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
