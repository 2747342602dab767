"""A projection (not a measurement) of decode throughput on one H200 for Qwen3-4B at 32K
generated tokens, fed by the admission behaviour measured in our equal-memory sweep.

Decode on a GPU is bound by HBM bandwidth: every step reads the weights once and every
retained K/V byte of the running batch once (GQA: one read per kv head). So

    step_time  = (W + kv_fill * M) / (eta * BW)
    tokens/s   = B / step_time
    B          = batch_per_pool_seq * M / (T * kv_bytes_per_token)

where, from a sweep run of policy P on a pool that holds `pool_seqs` full-length traces:
    batch_per_pool_seq = mean running batch / pool_seqs      (admission, growth, preemption)
    kv_fill            = mean blocks in use / usable blocks  (how full the pool ran)
and the target: W = weight bytes, M = KV memory (the paper's full-cache footprint, 77.0 GB),
T = trace length, BW = 4.8 TB/s, eta = achieved share of it (an assumption until a GPU run
measures it). The compression ratio is assumed to carry over from the tiny model's ~1,100-token
traces to 32K (the budget scales with the trace). The paper reports 77.0 -> 13.3 GB and
82.3 -> 356.4 tokens/s for the same model and length.

Usage: python3 tools/h200_projection.py [--sweep docs/results/throughput] [--eta 0.75]
"""

from __future__ import annotations

import argparse
import json
import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Qwen3-4B: 36 layers, 8 kv heads of 128 dims, bf16; ~4.02e9 parameters.
QWEN3_4B = {"layers": 36, "kv_heads": 8, "head_dim": 128, "bytes": 2, "params": 4.02e9}
TINY_HEADS = 8  # the tiny reasoner: 4 layers x 2 kv heads


def project(run: dict, full: dict, trace: int, memory: float, bw: float, eta: float) -> dict:
    m = QWEN3_4B
    kv_per_token = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * m["bytes"]
    weights = m["params"] * m["bytes"]
    usable = run["kv_blocks"] - 1
    full_len = (full["total_prompt_tokens"] + full["total_output_tokens"]) / full["num_requests"]
    pool_seqs = usable / (TINY_HEADS * math.ceil(full_len / run["block_size"]))
    batch_per_pool_seq = run["mean_running_batch"] / pool_seqs
    kv_fill = run["mean_used_blocks"] / usable
    batch = batch_per_pool_seq * memory / (trace * kv_per_token)
    step = (weights + kv_fill * memory) / (eta * bw)
    return {"policy": run["policy"], "budget": run["budget"],
            "compression": run["compression_ratio"], "accuracy": run["accuracy"],
            "batch_per_pool_seq": batch_per_pool_seq, "kv_fill": kv_fill,
            "projected_batch": batch, "kv_gb_read_per_step": kv_fill * memory / 1e9,
            "step_ms": 1e3 * step, "tokens_per_s": batch / step,
            "kv_gb_per_seq_peak": trace * kv_per_token / run["compression_ratio"] / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", default=os.path.join(ROOT, "docs", "results", "throughput"),
                    help="directory of tools/throughput_sweep.py's JSON files")
    ap.add_argument("--trace", type=int, default=32768, help="generated tokens per sequence")
    ap.add_argument("--memory-gb", type=float, default=77.0, help="KV memory (equal for all)")
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth in TB/s")
    ap.add_argument("--eta", type=float, default=0.75, help="achieved share of HBM bandwidth")
    args = ap.parse_args()
    runs = []
    for name in sorted(os.listdir(args.sweep)):
        if name.endswith(".json"):
            with open(os.path.join(args.sweep, name), encoding="utf-8") as f:
                runs.append(json.load(f))
    full = next(r for r in runs if r["policy"] == "full")
    rows = [project(r, full, args.trace, args.memory_gb * 1e9, args.bandwidth_tbs * 1e12,
                    args.eta) for r in runs]
    rows.sort(key=lambda r: (r["policy"] != "full", r["policy"], -(r["budget"] or 0)))
    base = next(r for r in rows if r["policy"] == "full")
    print(f"Projection for Qwen3-4B, {args.trace} generated tokens, {args.memory_gb:.1f} GB of "
          f"KV, {args.bandwidth_tbs} TB/s x eta {args.eta} (NOT a measurement)")
    print("| policy | budget | compression | answers (tiny model) | batch / pool-seq | pool fill "
          "| projected batch | KV read/step (GB) | step (ms) | tokens/s | vs full |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['budget'] or '-'} | {r['compression']:.2f}x "
              f"| {100 * r['accuracy']:.1f} % | {r['batch_per_pool_seq']:.2f} "
              f"| {100 * r['kv_fill']:.0f} % | {r['projected_batch']:.1f} "
              f"| {r['kv_gb_read_per_step']:.1f} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} "
              f"| {r['tokens_per_s'] / base['tokens_per_s']:.2f}x |")
    print("Paper (same model and length): 82.3 -> 356.4 tokens/s (4.33x), 77.0 -> 13.3 GB.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
