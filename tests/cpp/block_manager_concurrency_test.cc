// The thread-safety contract of BlockManager: several threads share one manager, each driving
// its own sequences through every operation while another thread queries and verifies the
// whole pool. Each call is atomic, so the pool is consistent after every call and nothing
// leaks. Built a second time under ThreadSanitizer by scripts/test.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "block_manager/block_manager.h"

namespace beaconkv {
namespace {

constexpr int kWorkers = 4;
constexpr int kOpsPerWorker = 1500;
constexpr SequenceId kIdsPerWorker = 1'000'000;
static_assert(kIdsPerWorker > kOpsPerWorker, "worker id ranges must not meet");

struct WorkerResult {
  int64_t ok_ops = 0;
  int64_t exhausted = 0;  // kResourceExhausted: an ordinary result under pressure
  std::string error;      // first unexpected status, with the seed
};

// Worker `w` draws its sequence ids from its own range, w * kIdsPerWorker upward (at most one
// new id per operation, so the ranges never meet), and applies random operations to them.
void Work(BlockManager& bm, int w, uint32_t seed, WorkerResult* out) {
  std::mt19937 rng(seed);
  const KvShape& shape = bm.shape();
  std::vector<SequenceId> live;
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  auto note = [&](const absl::Status& s, const char* op) {
    if (s.ok()) {
      ++out->ok_ops;
    } else if (s.code() == absl::StatusCode::kResourceExhausted) {
      ++out->exhausted;
    } else if (out->error.empty()) {
      out->error = std::string(op) + ": " + s.ToString() + " (seed " + std::to_string(seed) + ")";
    }
    return s.ok();
  };
  SequenceId next_id = w * kIdsPerWorker;
  for (int op = 0; op < kOpsPerWorker && out->error.empty(); ++op) {
    const int kind = live.empty() ? 0 : pick(7);
    if (kind == 0 && live.size() < 8) {
      const SequenceId id = next_id++;
      if (note(bm.AddSequence(id, 1 + pick(40)), "add")) live.push_back(id);
    } else if (kind == 1 && !live.empty()) {
      const SequenceId id = live[pick(static_cast<int>(live.size()))];
      if (*bm.IsSwappedOut(id)) {
        note(bm.SwapIn(id), "swap_in");
      } else {
        std::vector<SlotRef> slots(shape.num_heads_total());
        note(bm.AppendToken(id, absl::MakeSpan(slots)), "append");
      }
    } else if (kind == 2 && live.size() < 8) {
      const SequenceId parent = live[pick(static_cast<int>(live.size()))];
      if (!*bm.IsSwappedOut(parent)) {
        const SequenceId child = next_id++;
        if (note(bm.Fork(parent, child), "fork")) live.push_back(child);
      }
    } else if (kind == 3) {
      const int i = pick(static_cast<int>(live.size()));
      note(bm.FreeSequence(live[i]), "free");
      live.erase(live.begin() + i);
    } else if (kind == 4) {
      const SequenceId id = live[pick(static_cast<int>(live.size()))];
      if (*bm.IsSwappedOut(id)) continue;
      std::vector<KeepSet> keep;
      for (int32_t l = 0; l < shape.num_layers; ++l)
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          const int32_t n = *bm.RetainedTokens(id, l, h);
          KeepSet ks{l, h, {}};
          for (int32_t t = 0; t < n; ++t)
            if (t == 0 || pick(3) != 0) ks.slots.push_back(t);
          keep.push_back(std::move(ks));
        }
      note(bm.ApplyKeepSets(id, keep).status(), "compact");
    } else if (kind == 5) {
      const SequenceId id = live[pick(static_cast<int>(live.size()))];
      if (!*bm.IsSwappedOut(id)) note(bm.SwapOut(id), "swap_out");
    } else {
      const SequenceId id = live[pick(static_cast<int>(live.size()))];
      // Reads of one's own sequence are consistent: the table covers the retained tokens.
      const int32_t n = *bm.RetainedTokens(id, 0, 0);
      const int32_t blocks = static_cast<int32_t>(bm.BlockTable(id, 0, 0)->size());
      if (blocks != shape.BlocksFor(n) && out->error.empty())
        out->error = "table of " + std::to_string(id) + " does not cover its tokens";
    }
  }
  for (SequenceId id : live) note(bm.FreeSequence(id), "final free");
}

TEST(BlockManagerConcurrencyTest, ThreadsShareOnePoolWithoutCorruptingIt) {
  const uint32_t base_seed = 20240613;
  BlockManagerConfig config;
  config.shape = {2, 2, 4, 4};
  config.num_blocks = 1 + 160;  // small: threads compete for blocks and hit exhaustion
  config.num_host_blocks = 1 + 200;
  auto store = std::make_unique<CpuKvStore>(config.num_blocks, 4, 4);
  auto bm = BlockManager::Create(config, store.get());
  ASSERT_TRUE(bm.ok()) << bm.status();
  std::vector<WorkerResult> results(kWorkers);
  std::atomic<bool> done{false};
  std::string observer_error;
  int64_t observer_checks = 0;
  std::thread observer([&] {
    do {  // at least once, however quickly the workers finish
      absl::Status s = (*bm)->VerifyIntegrity();
      if (!s.ok() && observer_error.empty()) observer_error = s.ToString();
      const int32_t free = (*bm)->NumFreeBlocks();
      if ((free < 0 || free > (*bm)->NumUsableBlocks()) && observer_error.empty())
        observer_error = "free count out of range";
      (void)(*bm)->FreeList();
      (void)(*bm)->Fragmentation();
      (void)(*bm)->SequenceIds();
      ++observer_checks;
    } while (!done.load());
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w)
    workers.emplace_back(Work, std::ref(**bm), w, base_seed + w, &results[w]);
  for (std::thread& t : workers) t.join();
  done.store(true);
  observer.join();

  int64_t total_ok = 0;
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(results[w].error, "") << "worker " << w << " seed " << base_seed + w;
    total_ok += results[w].ok_ops;
  }
  EXPECT_EQ(observer_error, "") << "seed " << base_seed;
  EXPECT_GT(observer_checks, 0);
  EXPECT_GT(total_ok, kWorkers * 100);
  EXPECT_TRUE((*bm)->VerifyIntegrity().ok());
  EXPECT_EQ((*bm)->NumSequences(), 0);
  EXPECT_EQ((*bm)->NumFreeBlocks(), (*bm)->NumUsableBlocks()) << "blocks leaked";
  EXPECT_EQ((*bm)->NumFreeHostBlocks(), config.num_host_blocks - 1) << "host blocks leaked";
}

}  // namespace
}  // namespace beaconkv
