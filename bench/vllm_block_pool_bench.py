"""Per-block cost of vLLM's BlockPool next to ours, measured in one run.

vLLM: BlockPool.get_new_blocks(1) + free_blocks([block]) (prefix caching off), timed here.
Ours: BM_TakeGiveBackOneBlock from the bench_block_manager program, run by this script.
Usage: python3 bench/vllm_block_pool_bench.py BUILD_DIR   (vllm must be importable)
"""

import json
import statistics
import subprocess
import sys
import time


def time_vllm(repeats: int = 7, n: int = 200_000) -> tuple[float, str]:
    import vllm
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=1 << 16, enable_caching=False, hash_block_size=16)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            blocks = pool.get_new_blocks(1)
            pool.free_blocks(blocks)
        runs.append((time.perf_counter() - t0) / n * 1e9)
    return statistics.median(runs), vllm.__version__


def time_ours(build_dir: str) -> float:
    out = subprocess.run(
        [f"{build_dir}/bench/bench_block_manager", "--benchmark_filter=TakeGiveBack",
         "--benchmark_repetitions=7", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["benchmarks"]
    return statistics.median(r["cpu_time"] for r in rows if r.get("run_type") == "iteration")


def main() -> int:
    build_dir = sys.argv[1] if len(sys.argv) > 1 else "build/rel"
    ours = time_ours(build_dir)
    theirs, version = time_vllm()
    print("take + give back one block, median of 7:")
    print(f"  beaconkv BlockPool (C++):      {ours:8.1f} ns")
    print(f"  vLLM {version} BlockPool (Python): {theirs:8.1f} ns")
    print(f"  ratio vLLM / beaconkv:         {theirs / ours:8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
