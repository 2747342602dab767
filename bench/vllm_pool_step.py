"""Our share of a vLLM decode step, without vLLM: what `beaconkv.vllm` does per step in C++.

A `VllmKvCache` (the pool and policies the vLLM backend uses) shaped like the model's
config.json (default: the shipped tiny reasoner) holds R sequences in steady state; every step allocates one token for each, runs the
four layers' attention calls (K/V append, paged decode attention, the policies' query
observation) on random activations, and compresses (`compress_many`), as the scheduler and the
attention backend do inside vLLM. Prints milliseconds per step of each phase, averaged over the
last two thirds of the steps (the first third fills the heads past their budget).

    python3 bench/vllm_pool_step.py --rows 22 --policy beacon --budget 96 --interval 32
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import beaconkv
from beaconkv.reference import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    p.add_argument("--rows", type=int, default=22, help="running sequences (22: the 6 MiB batch)")
    p.add_argument("--policy", default="beacon")
    p.add_argument("--budget", type=int, default=96)
    p.add_argument("--interval", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="compression threads")
    p.add_argument("--attention-threads", type=int, default=0, help="0: same as --threads")
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--prompt", type=int, default=58, help="prompt tokens per sequence")
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="a policy knob (repeatable), as beaconkv eval's")
    args = p.parse_args(argv)
    mc = Config.load(os.path.join(args.model, "config.json"))
    layers, kv_heads = mc.num_hidden_layers, mc.num_key_value_heads
    heads, head_dim = mc.num_attention_heads, mc.head_dim
    attn_threads = args.attention_threads or args.threads
    observe = args.policy != "full"
    cfg = (beaconkv.make_policy_config(args.policy, args.budget, interval=args.interval,
                                       knobs=args.knob, model=args.model)
           if observe else "full")
    blocks_per_seq = layers * kv_heads * (-(-(args.prompt + args.steps) // args.block_tokens) + 1)
    cache = beaconkv.VllmKvCache(layers, kv_heads, heads, head_dim, args.block_tokens,
                                 args.rows * blocks_per_seq + 2, policy=cfg, rope_theta=mc.rope_theta,
                                 observe=observe)
    rng = np.random.default_rng(0)
    seqs = np.arange(1, args.rows + 1, dtype=np.int32)
    n = args.prompt
    # Token ids when the policy asks for them (the count bias), a list as the scheduler hands
    # them over; ids below 40, as the tiny reasoner's vocabulary.
    needs_ids = cache.needs_token_ids
    step_ids = [[int(t)] for t in rng.integers(0, 40, 64)] if needs_ids else [None] * 64
    for s in seqs.tolist():
        if not cache.allocate(s, n, n, rng.integers(0, 40, n).tolist() if needs_ids else None):
            raise RuntimeError("pool too small for the prompts")
        for layer in range(layers):
            k = rng.standard_normal((n, kv_heads, head_dim), dtype=np.float32)
            q = rng.standard_normal((n, heads, head_dim), dtype=np.float32)
            cache.attention(layer, np.array([s], np.int32), np.array([n], np.int32), q, k, k,
                            np.zeros((n, heads, head_dim), np.float32), head_dim**-0.5)
    ones = np.ones(args.rows, np.int32)
    qs = rng.standard_normal((64, args.rows, heads, head_dim), dtype=np.float32)
    ks = rng.standard_normal((64, args.rows, kv_heads, head_dim), dtype=np.float32)
    out = np.zeros((args.rows, heads, head_dim), np.float32)
    totals = {"allocate": 0.0, "attention": 0.0, "compress": 0.0}
    warm = args.steps // 3
    for step in range(args.steps):
        t0 = time.perf_counter()
        for s in seqs.tolist():
            if not cache.allocate(s, 1, n, step_ids[(step + s) % 64]):
                raise RuntimeError(f"step {step}: no room for sequence {s}")
        t1 = time.perf_counter()
        for layer in range(layers):
            cache.attention(layer, seqs, ones, qs[(step + layer) % 64], ks[(step + layer) % 64],
                            ks[(step + 3 * layer) % 64], out, head_dim**-0.5,
                            num_threads=attn_threads)
        t2 = time.perf_counter()
        if observe:  # as beaconkv.vllm.state: the full cache never compresses
            cache.compress_many(seqs, np.full(args.rows, n + step, np.int32), args.threads)
        t3 = time.perf_counter()
        if step >= warm:
            totals["allocate"] += t1 - t0
            totals["attention"] += t2 - t1
            totals["compress"] += t3 - t2
    per_step = {k: round(v / (args.steps - warm) * 1e3, 3) for k, v in totals.items()}
    per_step["total"] = round(sum(per_step.values()), 3)
    print(json.dumps({"rows": args.rows, "policy": args.policy, "budget": args.budget,
                      "interval": args.interval, "knobs": args.knob, "threads": args.threads,
                      "attention_threads": attn_threads, "ms_per_step": per_step}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
