"""Decode tokens/s against batch size, GEMM path vs batch-invariant path, in one run.

For each batch size, the same dev prompts run with the full cache, greedy, N new tokens with
eos ignored, one compute thread: once with OpenBLAS GEMMs (the throughput default) and once
with the batch-invariant dot products, interleaved and repeated; medians of wall-clock and of
CPU-time rates are printed with the ratio GEMM / invariant, and where a decode step's time goes
(attention vs the rest of the forward pass). Outputs of the two paths are compared.

Usage: python3 bench/batch_scaling.py [--batches 1,2,4,8,16,32,64] [--new-tokens 256]
       [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import beaconkv
from beaconkv.evaluate import load_problems
from beaconkv.tokenizer import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(model, prompts, new_tokens, batch_invariant):
    eng = beaconkv.Engine(model, max_batch=len(prompts), num_threads=1,
                          batch_invariant=batch_invariant)
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_new_tokens=new_tokens, ignore_eos=True)
    t0, c0 = time.perf_counter(), time.process_time()
    outs = eng.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = json.loads(eng.stats_json())
    t = s["time_seconds"]
    by_id = {o["id"]: o["output"] for o in outs}
    return {"tok_s": s["generated_tokens"] / wall, "tok_cpu_s": s["generated_tokens"] / cpu,
            "attention_share": t["attention"] / wall,
            "forward_share": t["decode_forward"] / wall,
            "outputs": [by_id[i] for i in range(len(prompts))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    tok = CharTokenizer.load(args.model)
    problems = load_problems(args.model, "dev")
    print(f"{'batch':>5} {'gemm tok/s':>11} {'inv tok/s':>10} {'ratio':>6} {'gemm tok/cpu-s':>15} "
          f"{'inv tok/cpu-s':>14} {'ratio':>6} {'attn share (gemm)':>18} {'same outputs':>13}")
    rows = []
    for batch in args.batches:
        prompts = [[tok.bos_id] + tok.encode(problems[i % len(problems)]["prompt"])
                   for i in range(batch)]
        res = {True: [], False: []}
        for _ in range(args.repeats):
            for inv in (False, True):
                res[inv].append(run(args.model, prompts, args.new_tokens, inv))

        def med(inv, key):
            return statistics.median(r[key] for r in res[inv])

        same = sum(a == b for a, b in zip(res[False][0]["outputs"], res[True][0]["outputs"]))
        row = {"batch": batch, "gemm_tok_s": med(False, "tok_s"), "inv_tok_s": med(True, "tok_s"),
               "gemm_tok_cpu_s": med(False, "tok_cpu_s"), "inv_tok_cpu_s": med(True, "tok_cpu_s"),
               "gemm_attention_share": med(False, "attention_share"), "same_outputs": same}
        rows.append(row)
        print(f"{batch:>5} {row['gemm_tok_s']:>11.0f} {row['inv_tok_s']:>10.0f} "
              f"{row['gemm_tok_s'] / row['inv_tok_s']:>5.2f}x {row['gemm_tok_cpu_s']:>15.0f} "
              f"{row['inv_tok_cpu_s']:>14.0f} {row['gemm_tok_cpu_s'] / row['inv_tok_cpu_s']:>5.2f}x "
              f"{100 * row['gemm_attention_share']:>17.0f}% {same:>9}/{batch}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"new_tokens": args.new_tokens, "repeats": args.repeats, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
