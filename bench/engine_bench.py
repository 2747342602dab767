"""Decode throughput of the reference engine on the tiny model, and where step time goes.

For batch 1, 8 and 32, with the full cache and with BeaconKV at budget 128: decode tokens/s
(prefill excluded), the share of decode time spent in attention and in the cache machinery
(block bookkeeping + scoring + selection + compaction). In the same run, the NumPy reference
decodes the same prompts one at a time, and the ratio engine/NumPy is printed.

Usage: python3 bench/engine_bench.py [--model DIR] [--new-tokens N] [--json OUT]
       python3 bench/engine_bench.py --policies full beacon "beacon:interval=32,draw_on_fill=true"
(--policies: specs as `beaconkv eval --policy` takes them, built by the core's registry, each
at --budget.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import beaconkv
from beaconkv import reference
from beaconkv.task import read_split
from beaconkv.tokenizer import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def engine_run(model, prompts, new_tokens, policy, threads):
    eng = beaconkv.Engine(model, policy=policy, max_batch=len(prompts), num_threads=threads)
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_new_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    eng.run()
    wall = time.perf_counter() - t0
    s = json.loads(eng.stats_json())
    t = s["time_seconds"]
    decode = wall - t["prefill"]
    machinery = t["bookkeeping"] + t["scoring"] + t["selection"] + t["compaction"]
    return {"tokens_per_s": s["generated_tokens"] / decode, "decode_seconds": decode,
            "attention_share": t["attention"] / decode, "machinery_share": machinery / decode,
            "scoring_share": t["scoring"] / decode, "selection_share": t["selection"] / decode,
            "compaction_share": t["compaction"] / decode,
            "bookkeeping_share": t["bookkeeping"] / decode}


def numpy_run(model_dir, prompts, new_tokens):
    model = reference.Model(model_dir)
    tokens = 0
    t0 = time.perf_counter()
    for p in prompts:
        model.generate(p, new_tokens)
        tokens += new_tokens
    return tokens / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--policies", nargs="+", default=["full", "beacon"],
                    help="policy specs NAME[-pooled][:KNOB=VALUE,...] (default: full beacon)")
    a = ap.parse_args()
    configs = {p: beaconkv.make_policy_config(p, a.budget, model=a.model) for p in a.policies}
    width = max(7, *(len(p) for p in a.policies))
    tok = CharTokenizer.load(a.model)
    problems = read_split(os.path.join(a.model, "data", "dev.jsonl"))
    rows = []
    # Which build is measured: an installed package shadows the tree's unless
    # PYTHONPATH=integration is set (scripts/setup.sh installs a snapshot of the tree).
    print(f"# beaconkv from {os.path.dirname(beaconkv.__file__)}")
    print(f"{'batch':>5} {'policy':<{width}} {'tok/s':>8} {'attn':>6} {'machinery':>9} "
          f"{'(score':>6} {'select':>6} {'compact':>7} {'book)':>6} {'x NumPy':>8}")
    for batch in (1, 8, 32):
        prompts = [[tok.bos_id] + tok.encode(p["prompt"]) for p in problems[:batch]]
        np_tps = numpy_run(a.model, prompts[:2], min(a.new_tokens, 128))
        for name, policy in configs.items():
            runs = [engine_run(a.model, prompts, a.new_tokens, policy, a.threads)
                    for _ in range(a.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            med.update(batch=batch, policy=name, numpy_tokens_per_s=np_tps,
                       speedup_vs_numpy=med["tokens_per_s"] / np_tps)
            rows.append(med)
            print(f"{batch:>5} {name:<{width}} {med['tokens_per_s']:>8.0f} "
                  f"{med['attention_share']:>6.1%} {med['machinery_share']:>9.1%} "
                  f"{med['scoring_share']:>6.1%} {med['selection_share']:>6.1%} "
                  f"{med['compaction_share']:>7.1%} {med['bookkeeping_share']:>6.1%} "
                  f"{med['speedup_vs_numpy']:>8.1f}")
            sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
