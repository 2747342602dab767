#include "engine/count_bias.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "block_manager/block_manager.h"
#include "block_manager/kv_store.h"
#include "core/policy_types.h"

namespace beaconkv {
namespace {

constexpr int32_t kLayers = 2, kKvHeads = 2, kBlockSize = 4;

struct Pool {
  Pool() : store(400, kBlockSize, 4) {
    BlockManagerConfig config;
    config.shape = {kLayers, kKvHeads, 4, kBlockSize};
    config.num_blocks = 400;
    bm = BlockManager::Create(config, &store).value();
  }
  CpuKvStore store;
  std::unique_ptr<BlockManager> bm;
};

// log(N / K) worked out from scratch: N counts the id in positions [0, position], K in the
// head's held slots.
std::vector<float> Expected(const BlockManager& bm, const CpuKvStore& store, SequenceId id,
                            int32_t layer, int32_t head, int32_t position,
                            const std::vector<int32_t>& tokens) {
  std::map<int32_t, int> n, k;
  for (int32_t p = 0; p <= position; ++p) ++n[tokens[p]];
  const auto table = bm.BlockTable(id, layer, head).value();
  const int32_t held = bm.RetainedTokens(id, layer, head).value();
  std::vector<int32_t> ids(held);
  for (int32_t j = 0; j < held; ++j) {
    ids[j] = tokens[store.position({table[j / kBlockSize], j % kBlockSize})];
    ++k[ids[j]];
  }
  std::vector<float> out(held);
  for (int32_t j = 0; j < held; ++j) out[j] = std::log(float(n[ids[j]]) / float(k[ids[j]]));
  return out;
}

// Decode steps with random evictions in between, some steps without: the in-place update of
// one new token must give what counting the head again gives, in every head, with every
// head's span still valid after the others were asked.
TEST(CountBiasTest, InPlaceUpdatesEqualARecountThroughEvictions) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::mt19937 rng(seed);
    Pool pool;
    const SequenceId id = 3;
    std::vector<int32_t> tokens;
    auto next_id = [&] { return static_cast<int32_t>(rng() % 4); };
    const int32_t prompt = 6;
    for (int32_t p = 0; p < prompt; ++p) tokens.push_back(next_id());
    ASSERT_TRUE(pool.bm->AddSequence(id, prompt).ok());
    CountBias bias;
    auto token_at = [&](int32_t p) { return tokens[p]; };
    for (int32_t step = 0; step < 60; ++step) {
      if (step > 0) {
        tokens.push_back(next_id());
        ASSERT_TRUE(pool.bm->AppendToken(id).ok());
      }
      const int32_t position = static_cast<int32_t>(tokens.size()) - 1;
      // The engine's prefetches first (only hints; on odd steps left out), then every head is
      // asked before any span is read, as the engine's decode step does.
      if (step % 2 == 0) {
        bias.PrefetchCounts(position, kLayers * kKvHeads, token_at);
        bias.PrefetchHeads(pool.store, position, kLayers * kKvHeads, token_at);
      }
      std::vector<absl::Span<const float>> spans;
      for (int32_t l = 0; l < kLayers; ++l) {
        for (int32_t h = 0; h < kKvHeads; ++h) {
          const auto got = bias.Head(*pool.bm, pool.store, id, l, h, position, token_at);
          ASSERT_TRUE(got.ok()) << got.status();
          spans.push_back(*got);
        }
      }
      for (int32_t l = 0; l < kLayers; ++l) {
        for (int32_t h = 0; h < kKvHeads; ++h) {
          const absl::Span<const float> got = spans[l * kKvHeads + h];
          const std::vector<float> want =
              Expected(*pool.bm, pool.store, id, l, h, position, tokens);
          ASSERT_EQ(got.size(), want.size());
          for (size_t j = 0; j < want.size(); ++j) {
            EXPECT_FLOAT_EQ(got[j], want[j]) << "seed " << seed << " step " << step;
          }
        }
      }
      if (rng() % 5 == 0) {  // evict a random half of one head of each layer
        std::vector<KeepSet> keep;
        for (int32_t l = 0; l < kLayers; ++l) {
          const int32_t h = static_cast<int32_t>(rng() % kKvHeads);
          const int32_t n = pool.bm->RetainedTokens(id, l, h).value();
          KeepSet k{l, h, {}};
          for (int32_t j = 0; j < n; ++j) {
            if (j + 1 == n || rng() % 2 == 0) k.slots.push_back(j);
          }
          keep.push_back(k);
        }
        ASSERT_TRUE(pool.bm->ApplyKeepSets(id, keep).ok());
      }
    }
  }
}

TEST(CountBiasTest, RefusesAnUnknownHeadOrSequenceAndAPositionGoingBack) {
  Pool pool;
  std::vector<int32_t> tokens = {1, 2, 1};
  auto token_at = [&](int32_t p) { return tokens[p]; };
  ASSERT_TRUE(pool.bm->AddSequence(1, 3).ok());
  CountBias bias;
  EXPECT_NE(bias.Head(*pool.bm, pool.store, 1, kLayers, 0, 2, token_at)
                .status()
                .message()
                .find("no head (2, 0)"),
            std::string::npos);
  EXPECT_FALSE(bias.Head(*pool.bm, pool.store, 7, 0, 0, 2, token_at).ok());
  ASSERT_TRUE(bias.Head(*pool.bm, pool.store, 1, 0, 0, 2, token_at).ok());
  const auto back = bias.Head(*pool.bm, pool.store, 1, 0, 0, 0, token_at);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("after counting through 2"), std::string::npos);
}

}  // namespace
}  // namespace beaconkv
