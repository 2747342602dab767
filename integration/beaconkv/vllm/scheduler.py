"""vLLM ``Scheduler`` whose KV accounting is BeaconKV's head-granular pool.

vLLM's scheduling logic (waiting queue, running set, chunked prefill, preemption by recompute)
is kept; every allocation decision is ours: ``allocate_slots`` answers "no" unless our pool
can hold the request's new tokens in every (layer, kv_head), and vLLM then preempts or stops
admitting exactly as it does when its own pool is full. vLLM's own block manager is kept only
to hand out block ids (its pool is made large enough never to be the constraint; its tensors
are never touched). After each step the policies compress the heads at their trigger and the
freed blocks admit waiting requests at the next ``schedule()``.
"""

from __future__ import annotations

import copy
import json
import logging
import os

from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler

from . import config as _config
from . import state as _state

logger = logging.getLogger(__name__)
# Where the scheduler writes its statistics (JSON) whenever it runs out of requests: how a
# benchmark in another process (vLLM's default layout) reads them. Unset: not written.
STATS_FILE_ENV = "BEACONKV_VLLM_STATS_FILE"


def _kv_bytes(kv_cache_config) -> int:
    """Bytes of vLLM's KV cache: blocks x (page of every layer of every group)."""
    per_block = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names)
                    for g in kv_cache_config.kv_cache_groups)
    return kv_cache_config.num_blocks * per_block


def _pool_blocks(kv_cache_config, geometry, block_size: int) -> int:
    """Our blocks in the memory vLLM sized its cache to (same bytes, float32 K, V, position)."""
    _, _, _, head_dim = geometry
    per_block = block_size * (2 * head_dim * 4 + 4)
    return max(2, _kv_bytes(kv_cache_config) // per_block)


class _PooledCacheManager:
    """vLLM's KVCacheManager with our pool in front of every allocation and free."""

    def __init__(self, inner, st: "_state.BeaconState"):
        self._inner = inner
        self._st = st
        self._seq_of: dict[str, int] = {}
        self._ops: list[tuple] | None = None  # multi-process: operations not yet shipped

    def log_ops(self) -> None:
        """Record every pool operation for the worker's replica (see connector.py)."""
        self._ops = []

    def take_ops(self) -> list[tuple]:
        ops, self._ops = self._ops, []
        return ops

    def apply_worker_keep_sets(self, keep: list) -> None:
        for seq, sets in keep:
            self._st.apply_keep_sets(seq, sets)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def seq_id(self, request_id: str) -> int | None:
        return self._seq_of.get(request_id)

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       *args, **kwargs):
        n = num_new_tokens + num_new_computed_tokens
        seq = self._seq_of.get(request.request_id)
        admitted = None
        max_total = request.num_prompt_tokens + request.max_tokens
        if seq is None:
            admitted = self._st.admits(request.num_tokens, max_total, n)
            if admitted is False:
                return None
        if not self._st.can_allocate(seq, n):
            return None
        blocks = self._inner.allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                            *args, **kwargs)
        if blocks is None:
            return None
        if seq is None:
            seq = int(self._inner.get_block_ids(request.request_id)[0][0])
            self._seq_of[request.request_id] = seq
        ids = None
        if self._st.needs_token_ids:  # the tokens this step computes (the count bias)
            start = request.num_computed_tokens
            ids = list(request.all_token_ids[start:start + n])
            if len(ids) != n or min(ids, default=0) < 0:
                raise RuntimeError(f"beaconkv.vllm: the ids of request {request.request_id}'s "
                                   f"tokens {start}..{start + n - 1} are not known when it is "
                                   "scheduled (async scheduling?); the count bias needs them")
        ok = self._st.allocate(seq, n, request.num_prompt_tokens, ids)
        assert ok, "room was checked above"
        if admitted:
            self._st.reserve(seq, max_total, request.num_tokens)
        if self._ops is not None:
            self._ops.append(("a", seq, n, request.num_prompt_tokens, ids))
        return blocks

    def _drop(self, request) -> None:
        seq = self._seq_of.pop(request.request_id, None)
        if seq is not None:
            self._st.free(seq)
            if self._ops is not None:
                self._ops.append(("f", seq))

    def free(self, request) -> None:
        self._drop(request)
        self._inner.free(request)

    def pop_blocks_for_free(self, request):
        self._drop(request)
        return self._inner.pop_blocks_for_free(request)

    @property
    def usage(self) -> float:
        c = self._st.cache
        return c.num_used_blocks / max(1, c.num_usable_blocks)


class Scheduler(_VllmScheduler):
    """Load with ``--scheduler-cls beaconkv.vllm.Scheduler`` (config: BEACONKV_VLLM_CONFIG)."""

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs):
        cfg = _config.from_env()
        self.beacon_enabled = cfg is not None
        if cfg is None:  # stock vLLM, with the same statistics
            super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
            self.beacon_state = None
            _state.set_stats_only({"max_running": 0, "running_sum": 0, "steps": 0,
                                   "preemptions": 0, "peak_kv_blocks": 0,
                                   "pool_blocks": kv_cache_config.num_blocks - 1,
                                   "block_bytes": _kv_bytes(kv_cache_config)
                                   // kv_cache_config.num_blocks})
            return
        mc = vllm_config.model_config
        geometry = _config.check_geometry(mc.hf_config, mc.dtype)
        if cfg.model is None:  # the policy "model" reads the served model's directory
            if cfg.names_model_policy() and not os.path.isdir(mc.model):
                raise ValueError(f"beaconkv.vllm: policy 'model' reads the served model's "
                                 f"config.json, and {mc.model!r} is not a local directory; "
                                 f"give \"model\": DIR in {_config.ENV}")
            cfg.model = mc.model
        if vllm_config.cache_config.enable_prefix_caching:
            raise ValueError("beaconkv.vllm does not support prefix caching: pass "
                             "--no-enable-prefix-caching (enable_prefix_caching=False)")
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ValueError("beaconkv.vllm does not support tensor parallelism yet")
        if getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError("beaconkv.vllm does not support speculative decoding")
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        from .attention import BeaconAttentionBackend

        path = AttentionBackendEnum.CPU_ATTN.get_path()
        if path != f"{BeaconAttentionBackend.__module__}.{BeaconAttentionBackend.__name__}":
            raise RuntimeError(f"beaconkv.vllm: the attention backend is {path}, not BeaconKV's: "
                               f"set {_config.ENV} before vLLM starts (the vllm.general_plugins "
                               "entry point registers it) or call beaconkv.vllm.register()")
        num_blocks = _pool_blocks(kv_cache_config, geometry, cfg.block_size)
        theta = _config.rope_theta(mc.hf_config)
        self.beacon_multiprocess = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
        # Multi-process: this pool is a replica that counts; the worker's policies decide.
        st = _state.BeaconState(cfg, geometry, num_blocks, theta,
                                observe=False if self.beacon_multiprocess else None)
        _state.set_state(st)
        # vLLM's manager only names blocks: make it big enough never to refuse.
        sched = vllm_config.scheduler_config
        per_req = -(-vllm_config.model_config.max_model_len // kwargs.get("block_size", 128))
        inflated = copy.deepcopy(kv_cache_config)
        inflated.num_blocks = max(kv_cache_config.num_blocks,
                                  sched.max_num_seqs * (per_req + 1) + 2)
        super().__init__(vllm_config, inflated, *args, **kwargs)
        self.beacon_state = st
        self.kv_cache_manager = _PooledCacheManager(self.kv_cache_manager, st)
        if self.beacon_multiprocess:
            from .connector import BeaconKVConnector

            if not isinstance(self.connector, BeaconKVConnector):
                raise RuntimeError(
                    "beaconkv.vllm with separate scheduler and model processes needs the "
                    "BeaconKVConnector: pass kv_transfer_config=beaconkv.vllm.connector."
                    "kv_transfer_config() (or set VLLM_ENABLE_V1_MULTIPROCESSING=0)")
            self.kv_cache_manager.log_ops()
            self.connector.attach(self.kv_cache_manager, {
                "config": cfg.to_json(), "geometry": list(geometry), "num_blocks": num_blocks,
                "rope_theta": theta})
        logger.info("beaconkv.vllm: policy %s, budget %s, pool of %d blocks of %d tokens",
                    cfg.policy, cfg.budget, num_blocks, cfg.block_size)

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        s = _state.stats()
        n = len(out.num_scheduled_tokens)
        if n:
            s["steps"] += 1
            s["running_sum"] += n
            s["max_running"] = max(s["max_running"], n)
        if not self.beacon_enabled:
            used = self.kv_cache_manager.block_pool.num_gpu_blocks - \
                self.kv_cache_manager.block_pool.get_num_free_blocks() - 1
            s["peak_kv_blocks"] = max(s["peak_kv_blocks"], used)
        return out

    def _preempt_request(self, request, *args, **kwargs):
        _state.stats()["preemptions"] += 1
        return super()._preempt_request(request, *args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        out = self._update_from_output(scheduler_output, model_runner_output)
        path = os.environ.get(STATS_FILE_ENV)
        if path and not self.has_unfinished_requests():
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(_state.stats(), f)
            os.replace(tmp, path)  # a reader never sees half a file
        return out

    def _update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        if self.beacon_enabled and not self.beacon_multiprocess:
            mgr = self.kv_cache_manager
            # Decode steps only (as the reference engine), after finished requests were freed.
            seqs, positions = [], []
            for req_id, n in scheduler_output.num_scheduled_tokens.items():
                seq = mgr.seq_id(req_id)
                req = self.requests.get(req_id)
                if n != 1 or seq is None or req is None:
                    continue
                if req.num_computed_tokens <= req.num_prompt_tokens:
                    continue
                seqs.append(seq)
                positions.append(req.num_computed_tokens - 1)
            self.beacon_state.compress_many(seqs, positions)
        return out
