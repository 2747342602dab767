// Preemption stress: many requests with random prompt and output lengths arrive in bursts at
// an engine whose pool is several times oversubscribed, under one policy and one preemption
// mode. Shared by the CI test (tests/cpp/preemption_stress_test.cc, VerifyIntegrity every
// step) and the standalone program (tests/stress/preemption_stress_main.cc, 10,000 requests).
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "tests/cpp/random_model.h"

namespace beaconkv::stress {

struct Options {
  int32_t num_requests = 200;
  uint32_t seed = 1;
  int32_t max_batch = 32;
  int32_t block_size = 4;
  int32_t max_prompt = 40;
  int32_t max_output = 64;
  int32_t oversubscription = 4;  // pool = (max_batch sequences of the longest length) / this
  bool verify_every_step = true;
};

struct Result {
  std::map<int64_t, RequestOutput> outputs;  // by request id
  EngineStats stats;
  int32_t leaked_blocks = 0;
  int32_t num_blocks = 0;
  std::string error;  // empty when every step succeeded
};

// The policy `name` with small budgets and intervals, so that eviction happens at these lengths.
inline PolicyConfig SmallPolicy(const std::string& name) {
  PolicyConfig c = *DefaultPolicyConfig(name);
  std::visit(
      [](auto& p) {
        if constexpr (requires { p.budget; }) p.budget = 24;
        if constexpr (requires { p.interval; }) p.interval = 8;
        if constexpr (requires { p.n_recent; }) p.n_recent = 8;
        if constexpr (requires { p.n_beacons; }) p.n_beacons = 4;
        if constexpr (requires { p.period; }) p.period = 16;
        if constexpr (requires { p.window; }) p.window = 4;
      },
      c);
  return c;
}

// Device blocks for `opts`: constrained = the pool a max_batch of longest sequences needs,
// divided by the oversubscription (never below what the longest sequence needs alone);
// otherwise 0 (the engine's ample default).
inline int32_t PoolBlocks(const Options& opts, int32_t heads, bool constrained) {
  if (!constrained) return 0;
  const int32_t per_seq =
      heads * ((opts.max_prompt + opts.max_output + opts.block_size - 1) / opts.block_size);
  return 1 + std::max(per_seq, opts.max_batch * per_seq / opts.oversubscription);
}

inline Result Run(const PolicyConfig& policy, PreemptionMode mode, const Options& opts,
                  bool constrained) {
  Result res;
  ModelWeights model = test_model::RandomModel(opts.seed, 512);
  const int32_t heads = model.config.num_layers * model.config.num_kv_heads;
  EngineConfig c;
  c.policy = policy;
  c.preemption = mode;
  c.max_batch = opts.max_batch;
  c.block_size = opts.block_size;
  c.num_blocks = PoolBlocks(opts, heads, constrained);
  c.num_threads = 1;
  c.verify_integrity = opts.verify_every_step;
  absl::StatusOr<std::unique_ptr<Engine>> made = Engine::Create(std::move(model), c);
  if (!made.ok()) {
    res.error = made.status().ToString();
    return res;
  }
  Engine& engine = **made;
  res.num_blocks = engine.block_manager().NumUsableBlocks() + 1;
  std::mt19937 rng(opts.seed * 7919u + 17u);
  std::vector<Request> requests(opts.num_requests);
  for (int32_t i = 0; i < opts.num_requests; ++i) {
    Request& r = requests[i];
    r.id = i;
    r.prompt.resize(1 + rng() % opts.max_prompt);
    for (int32_t& t : r.prompt) t = 3 + static_cast<int32_t>(rng() % 20);
    r.sampling.max_new_tokens = 1 + static_cast<int32_t>(rng() % opts.max_output);
    r.sampling.ignore_eos = true;
  }
  // Arrivals in bursts, decided per step from its own stream so that the schedule is the same
  // for every run with this seed.
  std::mt19937 arrivals(opts.seed * 104729u + 3u);
  size_t next = 0;
  while (next < requests.size() || engine.HasUnfinished()) {
    if (arrivals() % 4 == 0 || !engine.HasUnfinished()) {
      const size_t burst = 1 + arrivals() % 48;
      for (size_t k = 0; k < burst && next < requests.size(); ++k, ++next) {
        if (absl::Status s = engine.AddRequest(requests[next]); !s.ok()) {
          res.error = absl::StrFormat("AddRequest(%d): %s", next, s.ToString());
          return res;
        }
      }
    }
    std::vector<RequestOutput> done;
    if (absl::Status s = engine.Step(&done); !s.ok()) {
      res.error = absl::StrFormat("step %d: %s", engine.stats().steps, s.ToString());
      return res;
    }
    for (RequestOutput& o : done) {
      const int64_t id = o.id;
      if (!res.outputs.emplace(id, std::move(o)).second) {
        res.error = absl::StrFormat("request %d finished twice", id);
        return res;
      }
    }
  }
  res.stats = engine.stats();
  res.leaked_blocks =
      engine.block_manager().NumUsableBlocks() - engine.block_manager().NumFreeBlocks();
  return res;
}

// Every request finished normally and its output has the requested length.
inline std::string CheckComplete(const Result& r, const Options& opts) {
  if (!r.error.empty()) return r.error;
  if (static_cast<int32_t>(r.outputs.size()) != opts.num_requests)
    return absl::StrFormat("%d of %d requests finished", r.outputs.size(), opts.num_requests);
  if (r.leaked_blocks != 0) return absl::StrFormat("%d blocks leaked", r.leaked_blocks);
  for (const auto& [id, o] : r.outputs) {
    if (o.finish_reason != FinishReason::kLength)
      return absl::StrFormat("request %d finished with '%s'", id,
                             FinishReasonName(o.finish_reason));
  }
  return "";
}

// Outputs equal request by request.
inline std::string CompareOutputs(const Result& a, const Result& b) {
  for (const auto& [id, o] : a.outputs) {
    auto it = b.outputs.find(id);
    if (it == b.outputs.end()) return absl::StrFormat("request %d missing", id);
    if (it->second.output != o.output) return absl::StrFormat("request %d differs", id);
  }
  return "";
}

}  // namespace beaconkv::stress
