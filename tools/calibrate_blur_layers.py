"""Which layers of a model score blurred beacon rows, found on its tuning splits: `blur_layers`.

Blurred rows (`blur_speed`) help at tight budgets, but where they help is the model's own:
on the tiny reasoners' tuning splits the gain sat in one layer, and most of the loss at the
looser budget elsewhere (docs/results/accuracy.md, "Blurred rows in chosen layers"). This
tool applies the rule that chose those layers by hand:

1. At --budget (the tight budget), evaluate beacon (--knob extras in every run) without
   blurred rows, with them in every layer, and with them in each layer alone.
2. Rank the settings with blurred rows that beat none by mean accuracy over the splits
   (ties: fewer layers, then the lower layer).
3. With --guard-budget (the looser budget, where blurred rows can cost answers), go down the
   ranking and take the first setting whose mean accuracy there is at least that without
   blurred rows minus --tolerance; without it, the first. None passes: keep them off.

Tuning splits only: check the result once on held-out splits afterwards.

    python3 tools/calibrate_blur_layers.py --model models/tiny-reasoner \\
        --split /tmp/dev2-61403.jsonl --budget 96 --guard-budget 158 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from calibrate_layer_budgets import ROOT, evaluate_split, parse_split  # noqa: E402

EVERY = "every"  # the label of blurred rows in every layer (blur_layers empty)


def settings(num_layers: int) -> list[str]:
    """The settings with blurred rows: every layer, then each layer alone (when there is more
    than one), as labels."""
    return [EVERY] + ([str(i) for i in range(num_layers)] if num_layers > 1 else [])


def knobs_of(label: str, base: dict, blur_speed: float) -> dict:
    """The knobs of a setting: `base` plus blur_speed, and blur_layers for one layer."""
    out = dict(base, blur_speed=str(blur_speed))
    if label != EVERY:
        out["blur_layers"] = label
    return out


def ranked(tight: dict[str, float], off: float, num_layers: int) -> list[str]:
    """The settings that beat no blurred rows at the tight budget, best mean accuracy first
    (ties: fewer layers, then the lower layer)."""
    def layers(label: str) -> int:
        return num_layers if label == EVERY else 1

    def lowest(label: str) -> int:
        return 0 if label == EVERY else int(label)

    better = [s for s, acc in tight.items() if acc > off]
    return sorted(better, key=lambda s: (-tight[s], layers(s), lowest(s)))


def holds(acc: float, off: float, tolerance: float) -> bool:
    """Whether `acc` at the guard budget is at least `off` minus `tolerance` (a loss of exactly
    the tolerance, e.g. 2 of 1,000 problems at 0.002, holds whatever the rounding)."""
    return acc >= off - tolerance - 1e-9


def choose(order: list[str], guard: dict[str, float], off: float,
           tolerance: float) -> str | None:
    """The first of `order` whose guard-budget accuracy holds; None when none does. `guard`
    is looked up in `order`, and no further than the first that holds."""
    for label in order:
        if holds(guard[label], off, tolerance):
            return label
    return None


def model_layers(model: str) -> int:
    with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
        return int(json.load(f)["num_hidden_layers"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--split", action="append", required=True, metavar="SPLIT[@INTERVAL]",
                    help="tuning split (name or .jsonl), repeatable; @INTERVAL overrides "
                         "--interval for it")
    ap.add_argument("--budget", type=int, required=True, help="the tight budget")
    ap.add_argument("--guard-budget", type=int, default=None,
                    help="a looser budget the choice must not lose at (by --tolerance)")
    ap.add_argument("--tolerance", type=float, default=0.002,
                    help="accuracy the choice may give up at --guard-budget (default 0.002)")
    ap.add_argument("--interval", type=int, default=32)
    ap.add_argument("--num", type=int, default=None, help="first N problems of each split")
    ap.add_argument("--blur-speed", type=float, default=0.02,
                    help="blur_speed of every setting with blurred rows (default 0.02)")
    ap.add_argument("--policy", choices=["beacon", "beacon-pooled"], default="beacon")
    ap.add_argument("--knob", action="append", default=[], metavar="K=V",
                    help="other beacon knobs, kept in every run (repeatable)")
    ap.add_argument("--json", help="write the runs and the choice here")
    a = ap.parse_args(argv)
    if any("=" not in k for k in a.knob):
        ap.error(f"--knob takes K=V, got {[k for k in a.knob if '=' not in k]}")
    knobs = dict(k.split("=", 1) for k in a.knob)
    for name in ("blur_layers", "blur_speed"):
        if name in knobs:
            ap.error(f"--knob {name}: the tool sets it (--blur-speed for the speed)")
    if a.blur_speed <= 0:
        ap.error("--blur-speed must be > 0")
    if a.tolerance < 0:
        ap.error("--tolerance must be >= 0")
    if a.guard_budget is not None and a.guard_budget <= a.budget:
        ap.error(f"--guard-budget ({a.guard_budget}) must be above --budget ({a.budget})")
    if a.num is not None and a.num < 1:
        ap.error("--num must be >= 1")
    try:
        splits = [parse_split(s, a.interval) for s in a.split]
        num_layers = model_layers(a.model)
    except (ValueError, OSError, KeyError) as e:
        ap.error(str(e))

    def mean_accuracy(budget: int, run_knobs: dict) -> tuple[float, list[float]]:
        accs = [evaluate_split(a.model, s, budget, i, run_knobs, a.num, a.policy)[0]
                for s, i in splits]
        return sum(accs) / len(accs), accs

    report: dict = {"model": a.model, "policy": a.policy, "budget": a.budget,
                    "guard_budget": a.guard_budget, "tolerance": a.tolerance,
                    "blur_speed": a.blur_speed, "knobs": knobs,
                    "splits": [{"split": s, "interval": i} for s, i in splits]}
    off, off_accs = mean_accuracy(a.budget, knobs)
    report["off"] = {"mean_accuracy": off, "accuracy": off_accs}
    print(f"budget {a.budget}, no blurred rows: {off:.4f}", flush=True)
    tight: dict[str, float] = {}
    report["settings"] = []
    for label in settings(num_layers):
        acc, accs = mean_accuracy(a.budget, knobs_of(label, knobs, a.blur_speed))
        tight[label] = acc
        report["settings"].append({"layers": label, "mean_accuracy": acc, "accuracy": accs})
        print(f"  blurred rows in {'every layer' if label == EVERY else 'layer ' + label}: "
              f"{acc:.4f}", flush=True)
    order = ranked(tight, off, num_layers)
    report["ranking"] = order
    choice = None
    if a.guard_budget is None:
        choice = order[0] if order else None
    elif order:
        guard_off = mean_accuracy(a.guard_budget, knobs)[0]
        print(f"budget {a.guard_budget}, no blurred rows: {guard_off:.4f}", flush=True)

        class Evaluated(dict):
            """Guard-budget accuracies, each run on its first look-up: `choose` stops at the
            first setting that holds, so later ones are never run."""

            def __missing__(self, label: str) -> float:
                acc = mean_accuracy(a.guard_budget, knobs_of(label, knobs, a.blur_speed))[0]
                ok = holds(acc, guard_off, a.tolerance)
                print(f"  {label}: {acc:.4f} ({'kept' if ok else 'loses'})", flush=True)
                self[label] = acc
                return acc

        guard = Evaluated()
        choice = choose(order, guard, guard_off, a.tolerance)
        report["guard"] = {"off": guard_off, "settings": dict(guard)}
    report["choice"] = choice
    if choice is None:
        print("choice: no blurred rows (no setting beats them within the rule)")
    else:
        extra = "" if choice == EVERY else f" --knob blur_layers={choice}"
        print(f"choice: --knob blur_speed={a.blur_speed}{extra} ({tight[choice]:.4f} against "
              f"{off:.4f} at {a.budget})")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
