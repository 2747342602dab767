#!/usr/bin/env python3
"""The results table and plot of the accuracy study, from the JSON files of run_study.py.

    python3 tools/make_results.py [--results docs/results]

Reads RESULTS/*.json (one run each: ``beaconkv eval --json`` output, optionally with the
``variant``/``study_budget``/``mode`` fields run_study.py adds; without them the policy, budget
and ``teacher_forced`` fields are used) and writes

* RESULTS/accuracy.md: one row per policy x budget: greedy accuracy (and as a share of the
  full cache's), mean generated length, peak retained KV per sequence, compression ratio, and,
  where a teacher-forced run exists, the exact-trace rate (every reference token is the
  policy's argmax, so greedy decoding would reproduce the trace), token agreement, retrieval accuracy (and as a share of
  the full cache's) and mean KL. Only the block between the two markers below is rewritten,
  so text written around the table survives a re-run.
* RESULTS/accuracy_vs_compression.png: accuracy vs compression ratio, one line per policy
  (a second panel for teacher-forced retrieval accuracy when present).

``--pooled DIR [DIR ...]`` instead prints one markdown table over several result folders (one
split each, e.g. the held-out seeds): greedy accuracy per folder and pooled over all of them,
with the pooled 95 % Wilson interval; rows present in only some folders pool those.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

from beaconkv.stats import wilson

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BEGIN = "<!-- results-table:begin (tools/make_results.py) -->"
END = "<!-- results-table:end -->"


def policy_order() -> list[str]:
    """Row order: the core's registry order, each policy followed by its pooled variant."""
    import beaconkv

    order = []
    for spec in beaconkv.policy_specs():
        order += [spec.name, f"{spec.name}-pooled"]
    return order


def load_results(results_dir: str) -> dict:
    """{(variant, budget): {"greedy": dict, "tf": dict}} from every *.json in the folder."""
    rows: dict = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path, encoding="utf-8") as f:
            r = json.load(f)
        if not isinstance(r, dict) or "accuracy" not in r or "policy" not in r:
            continue  # not a run result (e.g. a summary written by another tool)
        variant = r.get("variant", r["policy"])
        budget = r.get("study_budget", r.get("budget"))
        mode = "tf" if r.get("teacher_forced") else "greedy"
        rows.setdefault((variant, budget), {})[mode] = r
    return rows


def sort_key(key: tuple) -> tuple:
    variant, budget = key
    order = policy_order()
    rank = order.index(variant) if variant in order else len(order)
    return rank, variant, -1 if budget is None else budget


def fmt(value, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def share(value, reference):
    """value / reference, or None when either is missing or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return value / reference


def fmt_interval(interval) -> str:
    return "–" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def table(rows: dict) -> str:
    full = rows.get(("full", None), {})
    full_acc = full.get("greedy", {}).get("accuracy")
    any_tf = any("tf" in r for r in rows.values())
    head = ["policy", "budget", "problems", "accuracy", "95 % CI", "vs full", "mean generated",
            "peak KV / seq (tokens per head)", "compression"]
    if any_tf:
        head += ["exact traces (TF)", "token agreement", "retrieval acc.", "retrieval vs full",
                 "mean KL", "compression (TF)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(rows, key=sort_key):
        g, t = rows[key].get("greedy"), rows[key].get("tf")
        base = g or t
        cells = [key[0], fmt(key[1], "d"), fmt(base.get("num_problems"), "d")]
        if g:
            cells += [fmt(g["accuracy"]), fmt_interval(wilson(g["accuracy"], g.get("num_problems"))),
                      fmt(share(g["accuracy"], full_acc), ".1%"),
                      fmt(g["mean_generated_tokens"], ".0f"),
                      fmt(g["peak_kv_tokens_per_seq"], ".0f"),
                      fmt(g["compression_ratio"], ".2f") + "×"]
        else:
            cells += ["–"] * 6
        if any_tf:
            if t:
                cells += [fmt(t["accuracy"]), fmt(t["token_agreement"], ".4f"),
                          fmt(t["retrieval_accuracy"]),
                          fmt(share(t["retrieval_accuracy"], t.get("full_retrieval_accuracy")),
                              ".1%"),
                          fmt(t["mean_kl"], ".4f"), fmt(t["compression_ratio"], ".2f") + "×"]
            else:
                cells += ["–"] * 6
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pooled_table(dirs: list[str], per_dir: list[dict]) -> str:
    """Greedy accuracy per folder and pooled (problems summed), one row per policy x budget;
    per_dir[i] is load_results(dirs[i])."""
    keys = sorted({k for rows in per_dir for k, r in rows.items() if "greedy" in r},
                  key=sort_key)
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    lines = ["| policy | budget | " + " | ".join(names) + " | pooled (95 % CI) | problems |",
             "|" + "---|" * (len(names) + 4)]
    for key in keys:
        cells, hits, total = [], 0.0, 0
        for rows in per_dir:
            g = rows.get(key, {}).get("greedy")
            cells.append(fmt(g["accuracy"]) if g else "–")
            if g:
                hits += g["accuracy"] * g["num_problems"]
                total += g["num_problems"]
        acc = hits / total
        lines.append(f"| {key[0]} | {fmt(key[1], 'd')} | " + " | ".join(cells) +
                     f" | {acc:.3f} {fmt_interval(wilson(acc, total))} | {total} |")
    return "\n".join(lines) + "\n"


def write_markdown(path: str, body: str) -> None:
    block = f"{BEGIN}\n{body}{END}\n"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            post = rest.split(END, 1)[1].lstrip("\n")
            text = pre + block + post
        else:
            text = text.rstrip("\n") + "\n\n" + block
    else:
        text = ("# Accuracy under compression\n\n"
                "Generated by `tools/make_results.py` from the JSON files beside this page "
                "(`tools/run_study.py`). `95 % CI`: Wilson score interval of the greedy "
                "accuracy; `vs full`: accuracy as a share of the full cache's; "
                "`peak KV / seq`: peak retained tokens per head of a sequence (all layers and heads averaged), averaged over sequences; "
                "compression = full-cache tokens / peak retained; TF = teacher forced.\n\n"
                + block)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def plot(rows: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = [("greedy", "accuracy", "exact-answer accuracy (greedy)")]
    if any("tf" in r for r in rows.values()):
        panels.append(("tf", "retrieval_accuracy", "retrieval-token accuracy (teacher forced)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    variants = sorted({v for v, _ in rows}, key=lambda v: sort_key((v, None)))
    for ax, (mode, metric, title) in zip(axes[0], panels):
        for variant in variants:
            # x: the memory saved on the reference traces (the teacher-forced run's ratio)
            # where there is one; a greedy run's own ratio shrinks when it derails early.
            pts = sorted((r.get("tf", r[mode])["compression_ratio"], r[mode][metric])
                         for (v, _), r in rows.items() if v == variant and mode in r)
            if not pts:
                continue
            if variant == "full":
                ax.axhline(pts[0][1], color="k", ls="--", lw=1, label="full")
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=variant,
                    lw=2.2 if variant.startswith("beacon") else 1.2)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}×"))
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("compression ratio (full KV / peak retained KV, on the reference traces)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=os.path.join(ROOT, "docs", "results"),
                   help="directory of tools/run_study.py's JSON files; accuracy.md is "
                        "written there")
    p.add_argument("--pooled", nargs="+", metavar="DIR",
                   help="print one table pooling the greedy runs of these folders and exit")
    args = p.parse_args(argv)
    if args.pooled:
        per_dir = [load_results(d) for d in args.pooled]
        missing = [d for d, rows in zip(args.pooled, per_dir) if not rows]
        if missing:
            print(f"no result JSON files in {', '.join(missing)}", file=sys.stderr)
            return 1
        sys.stdout.write(pooled_table(args.pooled, per_dir))
        return 0
    rows = load_results(args.results)
    if not rows:
        print(f"no result JSON files in {args.results}", file=sys.stderr)
        return 1
    md = os.path.join(args.results, "accuracy.md")
    png = os.path.join(args.results, "accuracy_vs_compression.png")
    write_markdown(md, table(rows))
    plot(rows, png)
    print(f"{len(rows)} rows -> {md}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
