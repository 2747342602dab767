#include <nlohmann/json.hpp>

#include "engine/engine_types.h"

namespace beaconkv {

std::string EngineStats::ToJson() const {
  nlohmann::json j;
  j["steps"] = steps;
  j["prefill_tokens"] = prefill_tokens;
  j["generated_tokens"] = generated_tokens;
  j["wall_seconds"] = wall_seconds;
  j["peak_running"] = peak_running;
  j["mean_running"] = mean_running;
  j["mean_used_blocks"] = mean_used_blocks;
  j["peak_used_blocks"] = peak_used_blocks;
  j["preemptions"] = {{"recompute", preemptions_recompute}, {"swap", preemptions_swap}};
  j["compressions"] = compressions;
  j["tokens_evicted"] = tokens_evicted;
  j["blocks_freed_by_eviction"] = blocks_freed_by_eviction;
  j["layers_observed_in_attention"] = layers_observed_in_attention;
  j["time_seconds"] = {{"prefill", time_prefill},        {"decode_forward", time_decode_forward},
                       {"attention", time_attention},    {"scoring", time_scoring},
                       {"selection", time_selection},    {"compaction", time_compaction},
                       {"bookkeeping", time_bookkeeping}};
  return j.dump();
}

}  // namespace beaconkv
