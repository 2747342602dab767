"""vLLM attention backend over BeaconKV's head-granular pool (registered over CPU_ATTN).

Each layer's forward writes the new tokens' K/V into their per-(layer, kv_head) slots of our
pool and attends over what each head retains (C++ ``VllmKvCache.attention``: the paged decode
kernel for one-token rows, causal attention by stored position for prefill rows), then hands
the step's queries to the policies. vLLM's own KV tensor is never read or written.

Which of our sequences a batch row is: our scheduler names each sequence by the first vLLM
block id of its request, so row r is sequence ``block_table[r, 0]``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionMetadataBuilder, AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

from . import state as _state

_LAYER_RE = re.compile(r"layers\.(\d+)\.")


@dataclass
class BeaconAttentionMetadata:
    num_actual_tokens: int
    seq_ids: np.ndarray     # [num_reqs] int32, our sequence of each row
    query_lens: np.ndarray  # [num_reqs] int32, new tokens of each row
    seq_lens: np.ndarray    # [num_reqs] int32, tokens of each row after this step


class BeaconAttentionMetadataBuilder(AttentionMetadataBuilder[BeaconAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        m = common_attn_metadata
        n = m.num_reqs
        qsl = m.query_start_loc_cpu[: n + 1].numpy().astype(np.int64)
        seq_lens = m.seq_lens[:n].cpu().numpy().astype(np.int32)
        seq_ids = m.block_table_tensor[:n, 0].cpu().numpy().astype(np.int32)
        return BeaconAttentionMetadata(
            num_actual_tokens=int(m.num_actual_tokens), seq_ids=seq_ids,
            query_lens=np.diff(qsl).astype(np.int32), seq_lens=seq_lens)


def _release(kv_cache) -> int:
    """Gives vLLM's own KV allocation back: the K/V live in our pool and this backend never
    reads or writes vLLM's tensor, so its storage (shared by every layer's view) is resized to
    zero at the first real forward instead of holding a second copy of the KV memory. Returns
    the bytes released."""
    if not isinstance(kv_cache, torch.Tensor):
        return 0
    storage = kv_cache.untyped_storage()
    released = storage.nbytes()
    if released > 0:
        storage.resize_(0)
    return released


class BeaconAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes=None, sliding_window=None, kv_cache_dtype: str = "auto",
                 logits_soft_cap=None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None) -> None:
        unsupported = []
        if alibi_slopes is not None:
            unsupported.append("ALiBi")
        if sliding_window is not None:
            unsupported.append("sliding window")
        if logits_soft_cap:
            unsupported.append("logits soft cap")
        if attn_type != AttentionType.DECODER:
            unsupported.append(f"attention type {attn_type}")
        if kv_sharing_target_layer_name is not None:
            unsupported.append("KV sharing across layers")
        if sinks is not None:
            unsupported.append("attention sinks")
        if kv_cache_dtype not in ("auto", "float32"):
            unsupported.append(f"kv cache dtype {kv_cache_dtype}")
        if unsupported:
            raise ValueError("BeaconKV cannot serve this model: " + ", ".join(unsupported))
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            from vllm.config import get_current_vllm_config

            ktc = get_current_vllm_config().kv_transfer_config
            if ktc is None or ktc.kv_connector != "BeaconKVConnector":
                raise RuntimeError(
                    "beaconkv.vllm with separate scheduler and model processes needs the "
                    "BeaconKVConnector (kv_transfer_config=beaconkv.vllm.connector."
                    "kv_transfer_config()), or VLLM_ENABLE_V1_MULTIPROCESSING=0")
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        self.kv_sharing_target_layer_name = None
        self.attn_type = attn_type
        self.sinks = None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if attn_metadata is None:  # profiling run
            return output
        st = _state.get()
        if st is None:  # warm-up runs before the scheduler (and so the pool) exists
            output.zero_()
            return output
        st.stats["vllm_kv_bytes_released"] += _release(kv_cache)
        m = _LAYER_RE.search(layer.layer_name)
        if m is None:
            raise RuntimeError(f"beaconkv.vllm: cannot tell the layer index of {layer.layer_name}")
        n = attn_metadata.num_actual_tokens
        if query.dtype != torch.float32:
            raise ValueError(f"BeaconKV's CPU pool needs float32 activations, got {query.dtype}")
        q = query[:n].contiguous().numpy()
        k = key[:n].contiguous().numpy()
        v = value[:n].contiguous().numpy()
        out = output[:n]
        assert out.is_contiguous()
        layer_index = int(m.group(1))
        if layer_index == 0:
            st.record_rows(attn_metadata.seq_ids, attn_metadata.query_lens,
                           attn_metadata.seq_lens)
        st.attention(layer_index, attn_metadata.seq_ids, attn_metadata.query_lens, q, k, v,
                     out.numpy(), self.scale)
        return output


class BeaconAttentionBackend(CPUAttentionBackend):
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"

    @staticmethod
    def get_impl_cls():
        return BeaconAttentionImpl

    @staticmethod
    def get_builder_cls():
        return BeaconAttentionMetadataBuilder
