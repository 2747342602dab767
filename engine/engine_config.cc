#include "engine/engine_config.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_format.h"
#include "block_manager/block_manager.h"
#include "block_manager/memory_check.h"
#include "core/policy_config.h"
#include "core/status_macros.h"

namespace beaconkv {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

absl::Status FieldError(const char* field, int64_t value, const char* rule) {
  return absl::InvalidArgumentError(
      absl::StrFormat("engine config: %s=%d, must be %s", field, value, rule));
}

}  // namespace

absl::Status ResolveEngineConfig(const ModelConfig& model, EngineConfig* config) {
  EngineConfig& c = *config;
  BKV_RETURN_IF_ERROR(ValidatePolicyConfig(c.policy));
  if (c.block_size < 1) return FieldError("block_size", c.block_size, ">= 1");
  if (c.max_batch < 1) return FieldError("max_batch", c.max_batch, ">= 1");
  if (c.watermark_blocks < 0) return FieldError("watermark_blocks", c.watermark_blocks, ">= 0");
  if (c.num_blocks < 0) return FieldError("num_blocks", c.num_blocks, ">= 0 (0 = ample)");
  if (c.num_host_blocks < 0) {
    return FieldError("num_host_blocks", c.num_host_blocks, ">= 0 (0 = as many as num_blocks)");
  }
  if (c.num_threads < 1) return FieldError("num_threads", c.num_threads, ">= 1");
  if (c.eos_token_id < -1 || c.eos_token_id >= model.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("engine config: eos_token_id=%d, must be -1 (none) or in [0, %d)",
                        c.eos_token_id, model.vocab_size));
  }
  const int32_t max_pos = model.max_position_embeddings;
  if (c.max_model_len < 0) {
    return FieldError("max_model_len", c.max_model_len, ">= 0 (0 = max_position_embeddings)");
  }
  if (c.max_model_len == 0) {
    if (max_pos <= 0) {
      return absl::InvalidArgumentError(
          "engine config: max_model_len is 0 (the model's max_position_embeddings) and the "
          "model does not set max_position_embeddings; set max_model_len");
    }
    c.max_model_len = max_pos;
  } else if (max_pos > 0 && c.max_model_len > max_pos) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "engine config: max_model_len=%d exceeds the model's max_position_embeddings=%d",
        c.max_model_len, max_pos));
  }
  const int64_t heads = static_cast<int64_t>(model.num_layers) * model.num_kv_heads;
  const int64_t blocks_per_head =
      (static_cast<int64_t>(c.max_model_len) + c.block_size - 1) / c.block_size;
  if (c.num_blocks == 0) {
    // At most 2^31 * 2^31 * 2^31: computed in 64 bits with an explicit overflow check.
    int64_t n = 0;
    if (__builtin_mul_overflow(static_cast<int64_t>(c.max_batch), heads, &n) ||
        __builtin_mul_overflow(n, blocks_per_head, &n) || n + 1 > kMaxInt32) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "engine config: the default pool (num_blocks=0) for max_batch=%d sequences of "
          "max_model_len=%d tokens in %d heads needs more than %d blocks; lower max_batch or "
          "max_model_len, or set num_blocks",
          c.max_batch, c.max_model_len, heads, kMaxInt32));
    }
    c.num_blocks = static_cast<int32_t>(n + 1);
  }
  if (c.preemption == PreemptionMode::kSwap && c.num_host_blocks == 0)
    c.num_host_blocks = c.num_blocks;
  if (c.watermark_blocks >= c.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("engine config: watermark_blocks=%d leaves no usable block of "
                        "num_blocks=%d",
                        c.watermark_blocks, c.num_blocks));
  }
  BlockManagerConfig bc;
  bc.shape = {model.num_layers, model.num_kv_heads, model.head_dim, c.block_size};
  bc.num_blocks = c.num_blocks;
  bc.num_host_blocks = c.num_host_blocks;
  BKV_RETURN_IF_ERROR(BlockManager::ValidateConfig(bc));
  // The device pool is a CpuKvStore here; the host (swap) pool is another.
  const int64_t device = CpuKvStoreBytes(c.num_blocks, c.block_size, model.head_dim);
  const int64_t host = CpuKvStoreBytes(c.num_host_blocks, c.block_size, model.head_dim);
  return CheckHostMemory(
      device < 0 || host < 0 ? -1 : device + host,
      absl::StrFormat("KV pool of num_blocks=%d + num_host_blocks=%d blocks "
                      "of %d tokens (head_dim %d)",
                      c.num_blocks, c.num_host_blocks, c.block_size, model.head_dim));
}

}  // namespace beaconkv
