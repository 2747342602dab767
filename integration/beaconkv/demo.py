"""``beaconkv demo``: a short, narrated run of the head-granular block manager.

Later the engine demo (accuracy and memory of BeaconKV vs the full cache on the shipped
tiny model) replaces this; for now it shows the memory mechanics the engine will rely on.
"""

from __future__ import annotations

from typing import TextIO

import numpy as np


def run_block_manager_demo(seed: int = 0, out: TextIO | None = None) -> dict:
    from . import BlockManager

    def say(msg: str = "") -> None:
        if out is not None:
            print(msg, file=out)

    rng = np.random.default_rng(seed)
    layers, kv_heads, head_dim, block_size = 4, 2, 8, 16
    num_blocks = 1 + 3 * layers * kv_heads * 10  # room for three 160-token sequences
    bm = BlockManager(layers, kv_heads, head_dim, block_size=block_size,
                      num_blocks=num_blocks, num_host_blocks=num_blocks)
    say(f"pool: {num_blocks - 1} blocks of {block_size} slots; each block belongs to one "
        f"(sequence, layer, kv_head); {layers} layers x {kv_heads} kv_heads")

    def kv(*shape):
        return (rng.standard_normal(shape).astype(np.float32),
                rng.standard_normal(shape).astype(np.float32))

    for seq in range(3):
        k, v = kv(layers, kv_heads, 32, head_dim)
        bm.add_sequence(seq, 32, keys=k, values=v)
    for _ in range(128):
        for seq in range(3):
            k, v = kv(layers, kv_heads, head_dim)
            bm.append_token(seq, keys=k, values=v)
    say(f"3 sequences x 160 tokens: {bm.num_used_blocks} blocks used, "
        f"{bm.num_free_blocks} free, usage {bm.usage:.0%}")
    try:
        bm.add_sequence(3, 160)
    except MemoryError as e:
        say(f"a 4th sequence does not fit: MemoryError: {e}")

    # Unequal per-head eviction: head h of layer l keeps 32 + 16 * ((l + h) % 3) tokens,
    # always the 4 first (sinks) and the most recent ones, the rest chosen at random.
    freed = 0
    for seq in range(3):
        keep = {}
        for layer in range(layers):
            for head in range(kv_heads):
                n = bm.retained_tokens(seq, layer, head)
                budget = 32 + 16 * ((layer + head) % 3)
                must = list(range(4)) + list(range(n - 8, n))
                rest = rng.choice(np.arange(4, n - 8), size=budget - len(must), replace=False)
                keep[(layer, head)] = np.array(sorted(must + rest.tolist()), dtype=np.int32)
        stats = bm.apply_keep_sets(seq, keep)
        freed += stats["blocks_freed"]
    retained = [bm.retained_tokens(0, layer, head) for layer in range(layers)
                for head in range(kv_heads)]
    say(f"evicted per head to budgets of 32/48/64 tokens: {freed} blocks freed at once; "
        f"sequence 0 keeps {min(retained)}..{max(retained)} tokens per head")
    bm.add_sequence(3, 160)
    say(f"the freed blocks now hold a 4th 160-token sequence: {bm.num_used_blocks} used, "
        f"{bm.num_free_blocks} free")

    before = bm.read_head(1, 2, 1)
    bm.swap_out(1)
    say(f"sequence 1 swapped to host: {bm.num_free_blocks} device blocks free")
    bm.swap_in(1)
    after = bm.read_head(1, 2, 1)
    exact = all(np.array_equal(a, b) for a, b in zip(before, after))
    say(f"swapped back in: K, V and positions bit-exact: {exact}")

    k, v = kv(layers, kv_heads, head_dim)
    bm.append_token(0, keys=k, values=v)  # every tail block of sequence 0 now partly full
    bm.fork(0, 10)
    shared_before = bm.num_used_blocks
    k, v = kv(layers, kv_heads, head_dim)
    bm.append_token(10, keys=k, values=v)
    say(f"fork 0 -> 10 shares every block; the child's next append copied "
        f"{bm.num_used_blocks - shared_before} shared, partly full tail blocks (copy-on-write)")
    bm.verify_integrity()
    say("VerifyIntegrity: ok")
    for seq in bm.sequence_ids:
        bm.free(seq)
    say(f"all freed: {bm.num_free_blocks} of {num_blocks - 1} blocks free")
    bm.verify_integrity()
    return {"blocks_freed_by_eviction": freed, "swap_exact": exact}


DEMO_INTERVAL = 32


def run_demo(model_dir: str, num: int = 24, budget: int | None = None,
             out: TextIO | None = None) -> list[dict]:
    """The main job: full cache vs BeaconKV vs SnapKV on a slice of the dev split.

    BeaconKV runs with the registry's defaults and, when the model recommends a setting of its
    own (config.json's beaconkv_policy), as that setting too (the row named "model").
    Prints accuracy, mean generated length, peak KV per sequence, compression ratio and
    tokens/s for each, and returns the rows."""
    import sys

    import beaconkv

    from .evaluate import evaluate

    if budget is None:
        budget = 128  # + interval 32: ~6.9x less KV than the full ~1,100-token traces
    say = (lambda msg="": print(msg, file=out)) if out is not None else (lambda msg="": None)
    say(f"BeaconKV demo: {num} dev problems of the tiny reasoner ({model_dir}), greedy, "
        f"budget {budget} tokens per head, compression every {DEMO_INTERVAL} tokens")
    model_spec = beaconkv.model_policy_spec(model_dir)
    runs = [("full", None, {}), ("beacon", budget, {"interval": DEMO_INTERVAL})]
    if model_spec is not None:
        runs.append((beaconkv.MODEL_POLICY, budget, {"interval": DEMO_INTERVAL}))
    runs.append(("snapkv", budget, {"interval": DEMO_INTERVAL}))
    rows = []
    for name, b, knobs in runs:
        r = evaluate(model_dir, "dev", name, b, num=num, max_batch=num,
                     policy_knobs=knobs, progress=sys.stderr if out is not None else None)
        rows.append(r.as_dict())
    say()
    say(f"{'policy':<8} {'budget':>6} {'accuracy':>9} {'mean gen':>9} {'peak KV/seq':>12} "
        f"{'compression':>12} {'tokens/s':>9}")
    for r in rows:
        say(f"{r['policy']:<8} {str(r['budget'] or '-'):>6} {r['accuracy']:>9.3f} "
            f"{r['mean_generated_tokens']:>9.0f} {r['peak_kv_tokens_per_seq']:>12.0f} "
            f"{r['compression_ratio']:>11.2f}x {r['tokens_per_second']:>9.0f}")
    say("peak KV/seq: the most tokens a sequence held per (layer, kv_head), averaged over "
        "sequences; compression: full-cache tokens / peak KV.")
    if model_spec is not None:
        say(f"{beaconkv.MODEL_POLICY}: the setting this model ships (config.json "
            f"beaconkv_policy): {model_spec}")
    return rows
