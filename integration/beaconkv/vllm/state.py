"""The KV pool and per-sequence policy state of one process, and the step statistics.

In the single-process mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the mode this adapter
supports) the scheduler and the model runner live in one process and share this object: the
scheduler allocates slots in it and applies keep-sets, the attention backend writes K/V into
those slots, attends over them and hands the queries to the policies.
"""

from __future__ import annotations

import numpy as np

_STATE: "BeaconState | None" = None


def get() -> "BeaconState | None":
    return _STATE


def set_state(state: "BeaconState | None") -> None:
    global _STATE
    _STATE = state


def _rotate_half_inverse(x: np.ndarray, position: int, theta: float) -> np.ndarray:
    """Undo HF rotate-half RoPE at `position` for rows of x [n, head_dim] (pre-RoPE queries)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = position * inv
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : d // 2].astype(np.float64), x[..., d // 2:].astype(np.float64)
    # forward: (x1 cos - x2 sin, x2 cos + x1 sin); inverse rotates by -angle
    return np.concatenate([x1 * cos + x2 * sin, x2 * cos - x1 * sin], -1).astype(np.float32)


class BeaconState:
    """One pool of head-granular blocks, the policy of every sequence, and statistics."""

    def __init__(self, cfg, geometry: tuple[int, int, int, int], num_blocks: int,
                 rope_theta: float):
        import beaconkv

        self.cfg = cfg
        self.num_layers, self.num_kv_heads, self.num_heads, self.head_dim = geometry
        self.group = self.num_heads // self.num_kv_heads
        self.rope_theta = rope_theta
        self.policy_cfg = cfg.policy_config()
        self.observes = cfg.policy != "full"
        self.cache = beaconkv.VllmKvCache(self.num_layers, self.num_kv_heads, self.num_heads,
                                          self.head_dim, cfg.block_size, num_blocks)
        self.policies: dict[int, object] = {}
        self.stats = {"peak_kv_blocks": 0, "tokens_evicted": 0, "blocks_freed_by_eviction": 0,
                      "compressions": 0, "max_running": 0, "running_sum": 0, "steps": 0,
                      "preemptions": 0, "pool_blocks": self.cache.num_usable_blocks}

    # --- scheduler side -------------------------------------------------------------------
    def can_allocate(self, seq_id: int | None, num_tokens: int) -> bool:
        sid = -1 if seq_id is None else seq_id
        return self.cache.blocks_needed(sid, num_tokens) <= self.cache.num_free_blocks

    def allocate(self, seq_id: int, num_tokens: int, prompt_len: int) -> bool:
        import beaconkv

        new = not self.cache.has(seq_id)
        if not self.cache.allocate(seq_id, num_tokens):
            return False
        if new:
            self.policies[seq_id] = beaconkv.Policy(
                self.policy_cfg, self.num_layers, self.num_kv_heads, self.group, self.head_dim,
                self.rope_theta, prompt_len)
        self.stats["peak_kv_blocks"] = max(self.stats["peak_kv_blocks"],
                                           self.cache.num_used_blocks)
        return True

    def free(self, seq_id: int) -> None:
        self.cache.free(seq_id)
        self.policies.pop(seq_id, None)

    def compress(self, seq_id: int, current_position: int) -> None:
        """Runs the sequence's policy on the heads at their trigger; frees blocks at once."""
        pol = self.policies.get(seq_id)
        if pol is None or not self.observes:
            return
        tokens = self.cache.head_tokens(seq_id)
        for layer in range(self.num_layers):
            due = pol.due_heads(layer, [int(t) for t in tokens[layer]])
            if not due:
                continue
            heads = [self.cache.read_head(seq_id, layer, h) for h in range(self.num_kv_heads)]
            sets = pol.compress(layer, [k for k, _ in heads], [p for _, p in heads], due,
                                current_position)
            keep = {(int(l), int(h)): [int(s) for s in slots] for l, h, slots in sets}
            out = self.cache.apply_keep_sets(seq_id, keep)
            self.stats["compressions"] += 1
            self.stats["tokens_evicted"] += out["tokens_evicted"]
            self.stats["blocks_freed_by_eviction"] += out["blocks_freed"]

    # --- model side -----------------------------------------------------------------------
    def attention(self, layer: int, seq_ids: np.ndarray, query_lens: np.ndarray,
                  seq_lens: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  out: np.ndarray, scale: float) -> None:
        """One layer of the batch, then the policies observe the step's queries."""
        self.cache.attention(layer, seq_ids, query_lens, q, k, v, out, scale)
        if not self.observes:
            return
        t0 = 0
        for sid, n, s in zip(seq_ids.tolist(), query_lens.tolist(), seq_lens.tolist()):
            pol = self.policies[sid]
            keys_needed = pol.needs_keys_on_observe
            for i in range(n):
                pos = s - n + i
                post = q[t0 + i].reshape(self.num_kv_heads, self.group, self.head_dim)
                pre = _rotate_half_inverse(post, pos, self.rope_theta)
                for h in range(self.num_kv_heads):
                    if keys_needed:
                        keys, positions = self.cache.read_head(sid, layer, h)
                        pol.observe(layer, h, pos, pre[h], post[h], keys, positions)
                    else:
                        pol.observe(layer, h, pos, pre[h], post[h])
            t0 += n


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
