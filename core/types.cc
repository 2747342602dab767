#include "core/types.h"

#include "absl/strings/str_format.h"

namespace beaconkv {

absl::Status KvShape::Validate() const {
  if (num_layers < 1 || num_kv_heads < 1 || head_dim < 1 || block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid KV shape: num_layers=%d num_kv_heads=%d head_dim=%d block_size=%d "
                        "(all must be >= 1)",
                        num_layers, num_kv_heads, head_dim, block_size));
  }
  return absl::OkStatus();
}

}  // namespace beaconkv
