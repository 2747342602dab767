"""The multi-process channel: a vLLM KV connector that carries BeaconKV's pool operations.

With vLLM's default process layout the scheduler (EngineCore) and the model (worker) are
separate processes, each with its own pool (``VllmKvCache``):

- scheduler -> worker, every step (``build_connector_meta``): the scheduler pool's operations
  since the last step, in order (allocate n tokens of sequence s / free s), plus the pool's
  geometry and size. The worker replays them before the forward, so both pools hold the same
  tokens per head (block ids may differ: only counts matter to the scheduler).
- worker -> scheduler, every step (``build_connector_worker_meta``): the keep-sets the
  worker's policies applied after the forward (decode rows only, as the reference engine).
  The scheduler applies the same keep-sets in ``update_connector_output`` (inside
  ``update_from_output``), so blocks freed by eviction admit waiting requests at the next
  ``schedule()``.

Enable with ``kv_transfer_config={"kv_connector": "BeaconKVConnector", "kv_role": "kv_both",
"kv_connector_module_path": "beaconkv.vllm.connector"}`` (``kv_transfer_config()`` below).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole,
                                                               KVConnectorWorkerMetadata)

from . import config as _config
from . import state as _state

NAME = "BeaconKVConnector"
# Tests set BEACONKV_VLLM_VERIFY=1: the worker's pool runs VerifyIntegrity() every step.
_VERIFY = os.environ.get("BEACONKV_VLLM_VERIFY") == "1"


def kv_transfer_config() -> dict:
    """The ``kv_transfer_config`` that turns the connector on."""
    return {"kv_connector": NAME, "kv_role": "kv_both",
            "kv_connector_module_path": __name__}


@dataclass
class BeaconStepMeta(KVConnectorMetadata):
    setup: dict                                    # cfg json, geometry, pool blocks, rope theta
    # [("a", seq, n, prompt_len, ids of the n tokens or None) | ("f", seq)]
    ops: list = field(default_factory=list)


@dataclass
class BeaconKeepMeta(KVConnectorWorkerMetadata):
    keep: list = field(default_factory=list)       # [(seq, [(layer, kv_head, slots)])]

    def aggregate(self, other: "BeaconKeepMeta") -> "BeaconKeepMeta":
        return BeaconKeepMeta(self.keep + other.keep)


class BeaconKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._pool = None     # scheduler side: the _PooledCacheManager whose ops we ship
        self._setup: dict = {}

    # --- scheduler side -------------------------------------------------------------------
    def attach(self, manager, setup: dict) -> None:
        """Called by beaconkv.vllm.Scheduler: ship `manager`'s operation log."""
        self._pool, self._setup = manager, setup

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        if self._pool is None:
            raise RuntimeError("BeaconKVConnector needs --scheduler-cls beaconkv.vllm.Scheduler")
        return BeaconStepMeta(self._setup, self._pool.take_ops())

    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, BeaconKeepMeta) and self._pool is not None:
            self._pool.apply_worker_keep_sets(meta.keep)

    # --- worker side ----------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        st = _state.get()
        if st is None:
            s = connector_metadata.setup
            st = _state.BeaconState(_config.parse(s["config"]), tuple(s["geometry"]),
                                    s["num_blocks"], s["rope_theta"])
            _state.set_state(st)
        for op in connector_metadata.ops:
            if op[0] == "a":
                if not st.allocate(op[1], op[2], op[3], op[4]):
                    raise RuntimeError(f"beaconkv.vllm: worker pool out of step with the "
                                       f"scheduler (no room for {op[2]} tokens of {op[1]})")
                st.prompt_len[op[1]] = op[3]
            else:
                st.free(op[1])
                st.prompt_len.pop(op[1], None)
        if _VERIFY:
            st.cache.verify_integrity()

    def build_connector_worker_meta(self):
        st = _state.get()
        if st is None or not st.observes:
            return None
        seqs, positions = [], []
        for sid, n, seq_len in st.take_step_rows():
            if n != 1 or seq_len <= st.prompt_len.get(sid, seq_len) or not st.cache.has(sid):
                continue
            seqs.append(sid)
            positions.append(seq_len - 1)
        # The step's decode rows at once: keep-sets chosen on BEACONKV_VLLM_THREADS threads.
        keep = st.compress_many(seqs, positions, return_keep=True)
        if _VERIFY:
            st.cache.verify_integrity()
        return BeaconKeepMeta(keep) if keep else None

    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self):
        pass
