// Validation and defaults of an EngineConfig against the model it will serve: every field is
// checked here, once, with sizes computed in 64 bits, and errors name the field.
#pragma once

#include "absl/status/status.h"
#include "engine/engine_types.h"
#include "engine/model_config.h"

namespace beaconkv {

// Checks every field of `*config` and fills the defaults that depend on the model
// (max_model_len 0 -> max_position_embeddings, num_blocks 0 -> room for max_batch sequences
// of max_model_len tokens, num_host_blocks 0 in swap mode -> num_blocks). kInvalidArgument
// names the field; kResourceExhausted when the pool cannot be allocated on this machine.
absl::Status ResolveEngineConfig(const ModelConfig& model, EngineConfig* config);

}  // namespace beaconkv
