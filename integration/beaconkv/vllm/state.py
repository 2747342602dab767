"""The KV pool and per-sequence policy state of one process, and the step statistics.

In the single-process mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the mode this adapter
supports) the scheduler and the model runner live in one process and share this object: the
scheduler allocates slots in it and applies keep-sets, the attention backend writes K/V into
those slots, attends over them and hands the queries to the policies.
"""

from __future__ import annotations

import os

import numpy as np

_STATE: "BeaconState | None" = None


def get() -> "BeaconState | None":
    return _STATE


def set_state(state: "BeaconState | None") -> None:
    global _STATE
    _STATE = state


class BeaconState:
    """One pool of head-granular blocks, the policy of every sequence, and statistics."""

    def __init__(self, cfg, geometry: tuple[int, int, int, int], num_blocks: int,
                 rope_theta: float, observe: bool | None = None):
        import beaconkv

        self.cfg = cfg
        # Threads of the decode attention and of the policies' compression:
        # BEACONKV_VLLM_THREADS, default the CPUs this process may run on, at most 4 (the
        # work per step is small). vLLM's CPU worker serves with fewer torch threads than
        # cores, and our phases run between its forward passes, so on our 2-core machines
        # two threads were 1.1-1.2x one (docs/vllm.md).
        threads = os.environ.get("BEACONKV_VLLM_THREADS")
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
        self.threads = int(threads) if threads else max(1, min(4, cpus))
        if self.threads < 1:
            raise ValueError(f"BEACONKV_VLLM_THREADS must be >= 1, got {threads}")
        self.num_layers, self.num_kv_heads, self.num_heads, self.head_dim = geometry
        self.group = self.num_heads // self.num_kv_heads
        self.rope_theta = rope_theta
        self.policy_cfg = cfg.policy_config()
        # A scheduler-side replica (multi-process) only counts: the worker's policies decide.
        self.observes = self.policy_cfg.name != "full" if observe is None else observe
        self.prompt_len: dict[int, int] = {}  # worker side (multi-process): seq -> prompt
        self._rows: list[tuple[int, int, int]] = []  # (seq, new tokens, seq_len) of the step
        self.cache = beaconkv.VllmKvCache(self.num_layers, self.num_kv_heads, self.num_heads,
                                          self.head_dim, cfg.block_size, num_blocks,
                                          policy=self.policy_cfg, rope_theta=rope_theta,
                                          observe=self.observes, scorer=cfg.scorer)
        # The count bias reads each held token's id: allocations then carry them.
        self.needs_token_ids = self.cache.needs_token_ids
        self.stats = {"vllm_kv_bytes_released": 0, "peak_kv_blocks": 0, "tokens_evicted": 0,
                      "blocks_freed_by_eviction": 0, "compressions": 0, "max_running": 0, "running_sum": 0, "steps": 0,
                      "preemptions": 0, "pool_blocks": self.cache.num_usable_blocks,
                      "block_bytes": cfg.block_size * (2 * self.head_dim * 4 + 4)}

    # --- scheduler side -------------------------------------------------------------------
    def can_allocate(self, seq_id: int | None, num_tokens: int) -> bool:
        sid = -1 if seq_id is None else seq_id
        return self.cache.blocks_needed(sid, num_tokens) <= self.cache.num_free_blocks

    def admits(self, prefill_len: int, max_total: int, num_tokens: int) -> bool | None:
        """Admission of a new (or recomputed) sequence that asks for `num_tokens` now.
        With reservation (the default) and a policy with a budget trigger: whether it fits
        now and at every coming step beside the admitted sequences, each head following its
        policy's cycle (the pool's future high point, not the sum of every sequence's peak);
        the caller then reserves it (`reserve`). None when there is nothing to reserve
        (optimistic admission, or a policy without a budget trigger: full, rpc): room for
        `num_tokens` alone decides, as in vLLM."""
        if self.cfg.admission != "reserve":
            return None
        if self.cache.peak_blocks(prefill_len, max_total) is None:
            return None
        return self.cache.admits(prefill_len, max_total, num_tokens)

    def reserve(self, seq_id: int, max_total: int, prefill_len: int) -> None:
        self.cache.reserve(seq_id, max_total, prefill_len)

    def allocate(self, seq_id: int, num_tokens: int, prompt_len: int,
                 token_ids=None) -> bool:
        """Room for `num_tokens` more tokens of `seq_id`; `token_ids` (their ids) only when
        the pool asks for them (needs_token_ids: the count bias)."""
        if not self.cache.allocate(seq_id, num_tokens, prompt_len, token_ids):
            return False
        self.stats["peak_kv_blocks"] = max(self.stats["peak_kv_blocks"],
                                           self.cache.num_used_blocks)
        return True

    def free(self, seq_id: int) -> None:
        self.cache.free(seq_id)

    def compress_many(self, seq_ids: list[int], positions: list[int],
                      return_keep: bool = False) -> list:
        """compress() for a step's sequences at once: the policies choose on up to
        BEACONKV_VLLM_THREADS threads, the pool applies in order. With return_keep, the
        keep-sets applied, [(seq, [(layer, kv_head, slots)])] (for the scheduler's replica);
        else []."""
        if not self.observes or not seq_ids:
            return []
        out = self.cache.compress_many(np.asarray(seq_ids, np.int32),
                                       np.asarray(positions, np.int32), self.threads,
                                       return_keep=return_keep)
        self._count(out)
        if not return_keep:
            return []
        return [(int(s), [(int(l), int(h), [int(x) for x in slots]) for l, h, slots in sets])
                for s, sets in out["keep"]]

    def apply_keep_sets(self, seq_id: int, sets: list) -> None:
        """Applies keep-sets computed elsewhere (the worker's policies)."""
        if not self.cache.has(seq_id):  # finished (and freed) in the same step
            return
        out = self.cache.apply_keep_sets(seq_id, {(l, h): slots for l, h, slots in sets})
        out["compressions"] = len({l for l, _, _ in sets})
        self._count(out)

    def _count(self, out: dict) -> None:
        self.stats["compressions"] += out["compressions"]
        self.stats["tokens_evicted"] += out["tokens_evicted"]
        self.stats["blocks_freed_by_eviction"] += out["blocks_freed"]

    def record_rows(self, seq_ids, query_lens, seq_lens) -> None:
        self._rows = list(zip(seq_ids.tolist(), query_lens.tolist(), seq_lens.tolist()))

    def take_step_rows(self) -> list[tuple[int, int, int]]:
        rows, self._rows = self._rows, []
        return rows

    # --- model side -----------------------------------------------------------------------
    def attention(self, layer: int, seq_ids: np.ndarray, query_lens: np.ndarray,
                  q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                  scale: float) -> None:
        """One layer of the batch; the policies observe the step's queries (in C++)."""
        self.cache.attention(layer, seq_ids, query_lens, q, k, v, out, scale,
                             num_threads=self.threads)


_STATS: dict | None = None


def set_stats_only(stats: dict) -> None:
    """Stock-vLLM runs keep only the scheduler statistics."""
    global _STATE, _STATS
    _STATE, _STATS = None, stats


def stats() -> dict:
    """The statistics of the current run (our pool's or stock vLLM's)."""
    if _STATE is not None:
        return _STATE.stats
    assert _STATS is not None
    return _STATS
