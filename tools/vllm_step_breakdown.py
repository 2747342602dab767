"""Where a vLLM engine step goes, for stock vLLM or our cache: one `beaconkv.vllm.bench` run
(same flags; single-process layout) with wall-clock timers around the engine step, the model's
linear layers (vLLM's CPU GEMM, `vllm._custom_ops.onednn_mm`), our attention
(`BeaconState.attention`, every layer) and our compressions (`BeaconState.compress_many`).
Prints milliseconds per step and each part's share; the rest of a step is vLLM's own
(scheduling, input preparation, the model's other ops, sampling, output handling).

    .venv-vllm/bin/python tools/vllm_step_breakdown.py --model models/tiny-reasoner \\
        --dataset-name reasoning --num-prompts 48 --dtype float32 \\
        --kv-cache-memory-bytes 6291456 --enforce-eager --seed 0 \\
        --policy beacon --budget 96 --knob interval=32 [--breakdown-json F]

The timers add a few microseconds per call (about 100 calls a step), so compare runs of this
tool with each other, not with plain bench runs.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

TIMED = (
    ("step", "vllm.v1.engine.core", "EngineCore", "step"),
    ("model GEMMs", "vllm._custom_ops", None, "onednn_mm"),
    ("our attention", "beaconkv.vllm.state", "BeaconState", "attention"),
    ("our compression", "beaconkv.vllm.state", "BeaconState", "compress_many"),
)


def _patch(totals):
    import importlib

    for key, module, cls, name in TIMED:
        try:
            owner = importlib.import_module(module)
            if cls is not None:
                owner = getattr(owner, cls)
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            continue  # another vLLM build: that part is reported as not measured

        def timed(*a, _fn=fn, _key=key, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                e = totals[_key]
                e[0] += 1
                e[1] += time.perf_counter() - t

        setattr(owner, name, timed)


def main(argv: list[str]) -> dict:
    out_json = None
    if "--breakdown-json" in argv:
        i = argv.index("--breakdown-json")
        out_json = argv[i + 1]
        del argv[i:i + 2]
    if "--layout" in argv and argv[argv.index("--layout") + 1] != "single":
        raise SystemExit("vllm_step_breakdown: the timers need the single-process layout")
    from beaconkv.vllm import bench

    totals = collections.defaultdict(lambda: [0, 0.0])
    _patch(totals)
    extra = bench.main(argv)
    steps = totals["step"][0]
    if steps == 0:
        raise SystemExit("vllm_step_breakdown: no engine step was timed")
    step_ms = 1e3 * totals["step"][1] / steps
    parts = {}
    for key, *_ in TIMED:
        calls, seconds = totals.get(key, (0, 0.0))
        parts[key] = {"calls": calls, "ms_per_step": 1e3 * seconds / steps}
    measured = sum(p["ms_per_step"] for k, p in parts.items() if k != "step")
    parts["rest (vLLM)"] = {"calls": None, "ms_per_step": step_ms - measured}
    print(f"\nEngine steps: {steps}; mean running {extra['mean_running']:.2f}; "
          f"{step_ms:.2f} ms per step")
    print(f"{'part':<18} {'calls/step':>10} {'ms/step':>9} {'share':>7}")
    for key, p in parts.items():
        if key == "step":
            continue
        calls = "" if p["calls"] is None else f"{p['calls'] / steps:.1f}"
        print(f"{key:<18} {calls:>10} {p['ms_per_step']:>9.3f} "
              f"{100 * p['ms_per_step'] / step_ms:>6.1f}%")
    result = {"steps": steps, "ms_per_step": step_ms, "parts": parts, "bench": extra}
    if out_json:
        with open(out_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    from beaconkv.vllm import SPIN_COUNT, SPIN_ENV

    if SPIN_ENV not in os.environ:  # as the bench: libgomp reads it when it loads
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  dict(os.environ, **{SPIN_ENV: SPIN_COUNT}))
    main(sys.argv[1:])
