"""Equal-memory throughput sweep: every policy on the same KV pool, one process, one run each.

The pool holds about four full-length reasoning traces (``--kv-blocks``); the full cache is
measured first, then each budgeted policy at each budget, interleaved by budget so that a
drift in machine load hits every policy alike. Results go to OUT/<label>.json (the
``beaconkv bench throughput`` JSON) and OUT/table.md + OUT/throughput.png are rebuilt
from every JSON in OUT.

Usage: python3 tools/throughput_sweep.py [--num-prompts 96] [--kv-blocks 2305]
       [--budgets 224,158,96,64] [--policies beacon,snapkv,h2o] [--out docs/results/throughput]
       [--table-only]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

from beaconkv.throughput import ThroughputConfig, format_report, run_throughput

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERVAL = 32  # compression every 32 tokens: the interval of the accuracy study


def label_of(policy: str, budget: int | None) -> str:
    return policy if budget is None else f"{policy}_b{budget}"


def run(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    plan: list[tuple[str, int | None, dict]] = [("full", None, {})]
    for b in args.budgets:
        for p in args.policies:
            plan.append((p, b, {} if p == "h2o" else {"interval": INTERVAL}))
    for policy, budget, knobs in plan:
        cfg = ThroughputConfig(model=args.model, num_prompts=args.num_prompts,
                               kv_blocks=args.kv_blocks, policy=policy, budget=budget,
                               knobs=knobs, dataset="reasoning", seed=args.seed,
                               preemption=args.preemption, admission=args.admission,
                               num_threads=args.num_threads)
        print(f"== {label_of(policy, budget)}", file=sys.stderr, flush=True)
        r = run_throughput(cfg, progress=sys.stderr)
        r["date"] = datetime.date.today().isoformat()
        print(format_report(r), file=sys.stderr, flush=True)
        with open(os.path.join(args.out, label_of(policy, budget) + ".json"), "w") as f:
            json.dump(r, f, indent=1)


def load(out: str) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json"):
            with open(os.path.join(out, name), encoding="utf-8") as f:
                rows.append(json.load(f))
    return rows


def table(rows: list[dict]) -> str:
    full = next((r for r in rows if r["policy"] == "full"), None)
    if full is None:
        raise SystemExit("no full-cache result to compare with")
    rows = sorted(rows, key=lambda r: (r["policy"] != "full", -(r["budget"] or 0), r["policy"]))
    head = ("| policy | budget | compression | answers exact | output tok/s (wall) | vs full "
            "| output tok per CPU s | vs full | median batch | vs full | max batch "
            "| preemptions (swap/recompute) | OOM |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    cpu_full = full["output_tokens_per_cpu_second"]
    lines = []
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['budget'] or '-'} | {r['compression_ratio']:.2f}x "
            f"| {r['correct']}/{r['num_requests']} ({100 * r['accuracy']:.1f} %) "
            f"| {r['output_tokens_per_second']:.0f} "
            f"| {r['output_tokens_per_second'] / full['output_tokens_per_second']:.2f}x "
            f"| {r['output_tokens_per_cpu_second']:.0f} "
            f"| {r['output_tokens_per_cpu_second'] / cpu_full:.2f}x "
            f"| {r['median_running_batch']:.0f} "
            f"| {r['median_running_batch'] / max(full['median_running_batch'], 1):.1f}x "
            f"| {r['max_running_batch']} "
            f"| {r['preemptions']['swap']}/{r['preemptions']['recompute']} "
            f"| {r['out_of_memory']} |")
    return head + "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = next(r for r in rows if r["policy"] == "full")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for policy in sorted({r["policy"] for r in rows} - {"full"}):
        # By budget, not by measured compression: a policy that derails writes short or
        # runaway garbage, and its own compression ratio stops meaning memory saved.
        pts = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["budget"])
        xs = [r["budget"] for r in pts]
        axes[0].plot(xs, [r["output_tokens_per_cpu_second"] / full["output_tokens_per_cpu_second"]
                          for r in pts], marker="o", label=policy)
        axes[1].plot(xs, [100 * r["accuracy"] for r in pts], marker="o", label=policy)
    axes[0].axhline(1.0, color="gray", ls="--", label="full cache")
    axes[1].axhline(100 * full["accuracy"], color="gray", ls="--", label="full cache")
    axes[0].set(xlabel="budget (KV tokens kept per head)", ylabel="output tokens per CPU second vs full",
                title="Throughput at equal KV memory")
    axes[1].set(xlabel="budget (KV tokens kept per head)", ylabel="answers exact (%)",
                title="Accuracy of the same runs")
    for ax in axes:
        ax.invert_xaxis()  # smaller budgets (more compression) to the right
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"),
                    help="HF-style model directory")
    ap.add_argument("--num-prompts", type=int, default=96, help="requests, all queued at once")
    ap.add_argument("--kv-blocks", type=int, default=2305,
                    help="2,304 usable blocks: ~4 full traces of ~1,150 tokens x 8 heads")
    ap.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")],
                    default=[224, 158, 96, 64], help="comma-separated budgets, e.g. 224,158")
    ap.add_argument("--policies", type=lambda s: s.split(","), default=["beacon", "snapkv", "h2o"],
                    help="comma-separated policy specs (full always runs as the baseline)")
    ap.add_argument("--preemption", choices=["recompute", "swap"], default="swap",
                    help="what a preempted sequence does: recompute or swap (to host memory)")
    ap.add_argument("--admission", choices=["reserve", "optimistic"], default="reserve",
                    help="reserve: admit a request only when its peak KV under the policy "
                         "fits; optimistic: when its prompt fits now")
    ap.add_argument("--num-threads", type=int, default=1, help="compute threads")
    ap.add_argument("--seed", type=int, default=0, help="dataset seed")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "throughput"),
                    help="directory of the run JSON files, the table and the plot")
    ap.add_argument("--table-only", action="store_true", help="rebuild the table and plot only")
    args = ap.parse_args()
    if not args.table_only:
        run(args)
    rows = load(args.out)
    md = table(rows)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(md)
    plot(rows, os.path.join(args.out, "throughput.png"))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
