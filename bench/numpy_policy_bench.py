#!/usr/bin/env python3
"""Times one compression event of snapkv, rkv and beacon in C++ (bench_policies) and in
NumPy (tests/python/numpy_policies.py, the same scoring math) in ONE run, and prints the ratios.

Shape (Qwen3-4B): 36 layers x 8 kv heads (GQA 4), head_dim 128, 2,176 cached tokens per head,
budget 2,048, 32 observation queries per query head. Fixed seeds. Both sides use one BLAS
thread unless --threads says otherwise.

    python3 bench/numpy_policy_bench.py --bench build/bench/bench_policies [--json out.json]
"""

import argparse
import json
import os
import subprocess
import sys
import time

LAYERS, KV_HEADS, GROUP, HEAD_DIM, TOKENS, BUDGET, PROMPT = 36, 8, 4, 128, 2176, 2048, 64


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default="build/bench/bench_policies", help="bench_policies binary")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads for both sides")
    p.add_argument("--repeats", type=int, default=3,
                   help="repetitions on each side; the best is kept")
    p.add_argument("--min-time", type=float, default=2.0, help="C++ --benchmark_min_time")
    p.add_argument("--layers", type=int, default=LAYERS, help="NumPy layers (C++ always 36)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


args = parse_args()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402  (after the thread settings)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
import numpy_policies as ref  # noqa: E402


def run_cpp():
    """Best (minimum) real time over --repeats repetitions, like the NumPy side."""
    out = subprocess.run(
        [args.bench, "--benchmark_format=json", f"--benchmark_min_time={args.min_time}",
         f"--benchmark_repetitions={args.repeats}"],
        check=True, capture_output=True, text=True, env=os.environ).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        if b["name"].startswith("BM_BeaconObserveStep"):
            res["beacon_observe_step_us"] = min(res.get("beacon_observe_step_us", 1e30),
                                                b["real_time"])
            continue
        name = b["name"].split("/")[1]
        assert b["time_unit"] == "ms"
        prev = res.get(name, {"ms": 1e30, "cpu_ms": 1e30})
        res[name] = {"ms": min(prev["ms"], b["real_time"]),
                     "cpu_ms": min(prev["cpu_ms"], b["cpu_time"]),
                     "state_MiB_per_seq": b["state_MiB_per_seq"]}
    return res


def numpy_data(layers):
    rng = np.random.default_rng(20260904)
    keys = rng.standard_normal((layers, KV_HEADS, TOKENS, HEAD_DIM), dtype=np.float32)
    recent_q = rng.standard_normal((layers, KV_HEADS, 48, GROUP, HEAD_DIM), dtype=np.float32)
    window_q = recent_q[:, :, -32:]
    # Beacon buffers as in bench_policies: 400 pre-RoPE queries per head (below buffer_max).
    buffers = rng.standard_normal((layers, KV_HEADS, 400, HEAD_DIM), dtype=np.float32)
    return keys, window_q, recent_q, buffers


def select_heads(scores, protect):
    return [ref.select(scores[h], protect, BUDGET) for h in range(scores.shape[0])]


def event_snapkv(keys, window_q, **_):
    protect = np.zeros(TOKENS, bool)
    protect[TOKENS - 32:] = True
    out = []
    for l in range(keys.shape[0]):
        s = np.zeros((KV_HEADS, TOKENS), np.float32)
        s[:, :TOKENS - 32] = ref.window_scores(keys[l], window_q[l], 32, 7, "max")
        out.append(select_heads(s, protect))
    return out


def event_rkv(keys, window_q, **_):
    protect = np.zeros(TOKENS, bool)
    protect[TOKENS - 32:] = True
    region = TOKENS - 32
    out = []
    for l in range(keys.shape[0]):
        imp = ref.window_scores(keys[l], window_q[l], 32, 7, "max")
        s = np.zeros((KV_HEADS, TOKENS), np.float32)
        for h in range(KV_HEADS):
            red = ref.redundancy(keys[l, h], 0.5)[:region]
            s[h, :region] = np.float32(0.1) * imp[h] - np.float32(0.9) * red
        out.append(select_heads(s, protect))
    return out


def event_beacon(keys, recent_q, buffers, **_):
    protect = np.zeros(TOKENS, bool)
    protect[:4] = True  # sinks: the prompt is not protected by default
    protect[TOKENS - 48:] = True
    out = []
    for l in range(keys.shape[0]):
        beacons = np.stack([ref.rope(buffers[l, h][ref.fps_cosine(buffers[l, h], 256)],
                                     TOKENS - 1, 1e6) for h in range(KV_HEADS)])
        rows = np.concatenate([recent_q[l].reshape(KV_HEADS, -1, HEAD_DIM), beacons], axis=1)
        s = ref.attention_scores(keys[l], rows[:, :, None, :], "max_probs", "max")
        out.append(select_heads(s, protect))
    return out


def time_numpy(fn, data):
    """Best wall and best process-CPU milliseconds per event over --repeats events."""
    wall = cpu = float("inf")
    for _ in range(args.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(**data)
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    scale = 1e3 * LAYERS / data["keys"].shape[0]
    return wall * scale, cpu * scale


def main():
    cpp = run_cpp()
    keys, window_q, recent_q, buffers = numpy_data(args.layers)
    data = dict(keys=keys, window_q=window_q, recent_q=recent_q, buffers=buffers)
    rows = []
    for name, fn in (("snapkv", event_snapkv), ("rkv", event_rkv), ("beacon", event_beacon)):
        np_ms, np_cpu_ms = time_numpy(fn, data)
        rows.append({"policy": name, "cpp_ms": cpp[name]["ms"], "numpy_ms": np_ms,
                     "cpp_cpu_ms": cpp[name]["cpu_ms"], "numpy_cpu_ms": np_cpu_ms,
                     "speedup_wall": np_ms / cpp[name]["ms"],
                     "speedup_cpu": np_cpu_ms / cpp[name]["cpu_ms"],
                     "state_MiB_per_seq": cpp[name]["state_MiB_per_seq"]})
    print(f"one compression event: {LAYERS} layers x {KV_HEADS} kv heads (GQA {GROUP}), "
          f"head_dim {HEAD_DIM}, {TOKENS} tokens/head, budget {BUDGET}, BLAS threads "
          f"{args.threads}, numpy {np.__version__}")
    print("ms per event, best of repeats; wall clock and process CPU time (on a shared machine "
          "the CPU-time ratio is the comparable one)")
    print(f"{'policy':8} {'C++ wall':>9} {'NumPy wall':>11} {'ratio':>6} | {'C++ cpu':>8} "
          f"{'NumPy cpu':>10} {'ratio':>6} | {'state MiB/seq':>13}")
    for r in rows:
        print(f"{r['policy']:8} {r['cpp_ms']:9.1f} {r['numpy_ms']:11.1f} {r['speedup_wall']:6.2f} | "
              f"{r['cpp_cpu_ms']:8.1f} {r['numpy_cpu_ms']:10.1f} {r['speedup_cpu']:6.2f} | "
              f"{r['state_MiB_per_seq']:13.1f}")
    print("ratio = NumPy time / C++ time (> 1: C++ faster)")
    beacon_buffer = LAYERS * KV_HEADS * 512 * HEAD_DIM * 4 / 2**20
    print(f"beacon buffers at capacity: {beacon_buffer:.1f} MiB per sequence "
          f"(512 x {HEAD_DIM} float32 per (layer, kv_head)); the rest of the beacon state is "
          f"the recent-query rings")
    print(f"beacon per-step observe (all {LAYERS * KV_HEADS} heads, FPS amortised): "
          f"{cpp['beacon_observe_step_us']:.0f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "threads": args.threads, "numpy": np.__version__,
                       "beacon_buffer_MiB_per_seq": beacon_buffer,
                       "beacon_observe_step_us": cpp["beacon_observe_step_us"]}, f, indent=2)


if __name__ == "__main__":
    main()
