// Randomised differential test: a long random mix of operations runs on the block manager
// and on a deliberately simple model of it (blocks are shared_ptrs to token lists, sharing
// is their use_count, nothing is ever reused). After every operation: the status the model
// predicts, VerifyIntegrity(), free block counts; after every compaction: slot contents
// and K/V bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "block_manager/block_manager.h"

namespace beaconkv {
namespace {

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 2, kNumBlocks = 160, kHostBlocks = 120;

struct Token {
  SequenceId origin;  // the sequence whose append wrote the bytes
  int32_t position;
  bool operator==(const Token&) const = default;
};
// A physical block; owners that share it may use different prefixes of it (a compaction
// can shorten one owner's tail without touching the block).
using ModelBlock = std::shared_ptr<std::vector<Token>>;
struct ModelRef {
  ModelBlock block;
  int count = 0;  // tokens of `block` this owner uses
};
struct ModelSeq {
  int32_t next_position = 0;
  bool swapped = false;
  std::vector<std::vector<ModelRef>> heads;  // [heads][blocks]
};

float Encode(const Token& t, int head, int d) {
  return t.origin * 4096.0f + head * 1024.0f + t.position + d * 0.25f;
}

class RandomOpsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    bs_ = GetParam();
    BlockManagerConfig c;
    c.shape = {kLayers, kHeads, kHeadDim, bs_};
    c.num_blocks = kNumBlocks;
    c.num_host_blocks = kHostBlocks;
    store_ = std::make_unique<CpuKvStore>(kNumBlocks, bs_, kHeadDim);
    bm_ = *BlockManager::Create(c, store_.get());
  }

  int HeadsTotal() const { return kLayers * kHeads; }
  static int NumTokens(const std::vector<ModelRef>& head) {
    int n = 0;
    for (const auto& r : head) n += r.count;
    return n;
  }
  static std::vector<Token> Tokens(const std::vector<ModelRef>& head) {
    std::vector<Token> out;
    for (const auto& r : head) out.insert(out.end(), r.block->begin(), r.block->begin() + r.count);
    return out;
  }
  int UsedBlocks(bool swapped) const {
    std::set<const void*> live;
    for (const auto& [id, s] : model_)
      if (s.swapped == swapped)
        for (const auto& head : s.heads)
          for (const auto& r : head) live.insert(r.block.get());
    return static_cast<int>(live.size());
  }
  int TotalBlocks(const ModelSeq& s) const {
    int n = 0;
    for (const auto& head : s.heads) n += static_cast<int>(head.size());
    return n;
  }
  void WriteBytes(SequenceId id, int h, int index, const Token& t) {
    const SlotRef slot = *bm_->Slot(id, h / kHeads, h % kHeads, index);
    for (int d = 0; d < kHeadDim; ++d) {
      store_->key(slot)[d] = Encode(t, h, d);
      store_->value(slot)[d] = -Encode(t, h, d);
    }
  }
  void CheckSequence(SequenceId id) {
    const ModelSeq& s = model_.at(id);
    for (int h = 0; h < HeadsTotal(); ++h) {
      const std::vector<Token> want = Tokens(s.heads[h]);
      ASSERT_EQ(*bm_->RetainedTokens(id, h / kHeads, h % kHeads), static_cast<int>(want.size()));
      if (s.swapped) continue;
      for (int i = 0; i < static_cast<int>(want.size()); ++i) {
        const SlotRef slot = *bm_->Slot(id, h / kHeads, h % kHeads, i);
        ASSERT_EQ(store_->position(slot), want[i].position) << "seq " << id << " head " << h;
        for (int d = 0; d < kHeadDim; ++d) {
          ASSERT_EQ(store_->key(slot)[d], Encode(want[i], h, d));
          ASSERT_EQ(store_->value(slot)[d], -Encode(want[i], h, d));
        }
      }
    }
  }
  SequenceId PickLive() {
    auto it = model_.begin();
    std::advance(it, rng_() % model_.size());
    return it->first;
  }

  void OpAdd() {
    const SequenceId id = next_id_++;
    const int prompt = 1 + rng_() % (3 * bs_ + 2);
    const int need = HeadsTotal() * ((prompt + bs_ - 1) / bs_);
    absl::Status st = bm_->AddSequence(id, prompt);
    if (need > free_) {
      ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
      ++exhausted_;
      return;
    }
    ASSERT_TRUE(st.ok()) << st;
    ModelSeq s;
    s.next_position = prompt;
    s.heads.resize(HeadsTotal());
    for (int h = 0; h < HeadsTotal(); ++h) {
      for (int p = 0; p < prompt; ++p) {
        if (p % bs_ == 0) s.heads[h].push_back({std::make_shared<std::vector<Token>>(), 0});
        s.heads[h].back().block->push_back({id, p});
        s.heads[h].back().count++;
        WriteBytes(id, h, p, {id, p});
      }
    }
    model_[id] = std::move(s);
  }

  void OpAppend(SequenceId id) {
    ModelSeq& s = model_.at(id);
    absl::Status st = bm_->AppendToken(id);
    if (s.swapped) {
      ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
      return;
    }
    int need = 0;
    for (const auto& head : s.heads)
      need += head.empty() || head.back().count == bs_ || head.back().block.use_count() > 1;
    if (need > free_) {
      ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
      return;
    }
    ASSERT_TRUE(st.ok()) << st;
    const Token t{id, s.next_position++};
    for (int h = 0; h < HeadsTotal(); ++h) {
      auto& head = s.heads[h];
      if (head.empty() || head.back().count == bs_) {
        head.push_back({std::make_shared<std::vector<Token>>(), 0});
      } else if (head.back().block.use_count() > 1) {
        head.back().block = std::make_shared<std::vector<Token>>(*head.back().block);
      }
      head.back().block->resize(head.back().count);
      head.back().block->push_back(t);
      head.back().count++;
      WriteBytes(id, h, NumTokens(head) - 1, t);
    }
  }

  void OpFork(SequenceId parent) {
    const SequenceId child = next_id_++;
    absl::Status st = bm_->Fork(parent, child);
    if (model_.at(parent).swapped) {
      ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
      return;
    }
    ASSERT_TRUE(st.ok()) << st;
    model_[child] = model_.at(parent);
    ++forks_;
  }

  void OpSwap(SequenceId id) {
    ModelSeq& s = model_.at(id);
    const int need = TotalBlocks(s);
    absl::Status st = s.swapped ? bm_->SwapIn(id) : bm_->SwapOut(id);
    if (need > (s.swapped ? free_ : host_free_)) {
      ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
      return;
    }
    ASSERT_TRUE(st.ok()) << st;
    for (auto& head : s.heads)
      for (auto& r : head) r.block = std::make_shared<std::vector<Token>>(*r.block);  // private
    s.swapped = !s.swapped;
    ++swaps_;
  }

  void OpKeepSets(SequenceId id) {
    ModelSeq& s = model_.at(id);
    std::vector<KeepSet> sets;
    for (int h = 0; h < HeadsTotal(); ++h) {
      if (rng_() % 3 == 0) continue;
      const int n = NumTokens(s.heads[h]);
      std::vector<int32_t> all(n);
      for (int i = 0; i < n; ++i) all[i] = i;
      std::shuffle(all.begin(), all.end(), rng_);
      all.resize(n == 0 ? 0 : rng_() % (n + 1));
      sets.push_back({h / kHeads, h % kHeads, all});
    }
    const bool corrupt = !sets.empty() && rng_() % 8 == 0;
    if (corrupt) {
      auto& slots = sets[rng_() % sets.size()].slots;
      slots.push_back(slots.empty() || rng_() % 2 ? 1 << 20 : slots.front());
    }
    absl::StatusOr<CompactionPlan> plan = bm_->ApplyKeepSets(id, sets);
    if (s.swapped) {
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
      return;
    }
    if (corrupt) {
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
      return;
    }
    // Spec: holes below k are filled by the survivors at or above k, both ascending; a
    // shared block that receives a survivor is copied first.
    int need = 0;
    std::vector<std::vector<std::pair<int, int>>> moves(sets.size());
    for (size_t i = 0; i < sets.size(); ++i) {
      const auto& head = s.heads[sets[i].layer * kHeads + sets[i].kv_head];
      const int n = NumTokens(head), k = static_cast<int>(sets[i].slots.size());
      std::vector<bool> kept(n, false);
      for (int32_t slot : sets[i].slots) kept[slot] = true;
      std::vector<int> holes, survivors;
      for (int j = 0; j < n; ++j) {
        if (j < k && !kept[j]) holes.push_back(j);
        if (j >= k && kept[j]) survivors.push_back(j);
      }
      std::set<int> written;
      for (size_t m = 0; m < holes.size(); ++m) {
        moves[i].push_back({survivors[m], holes[m]});
        written.insert(holes[m] / bs_);
      }
      for (int b : written) need += head[b].block.use_count() > 1;
    }
    if (need > free_) {
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      return;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    cow_compactions_ += !plan->copies.empty();
    blocks_freed_ += plan->blocks_freed;
    for (size_t i = 0; i < sets.size(); ++i) {
      auto& head = s.heads[sets[i].layer * kHeads + sets[i].kv_head];
      const std::vector<Token> tokens = Tokens(head);
      const int k = static_cast<int>(sets[i].slots.size());
      for (auto [from, to] : moves[i]) {
        ModelRef& r = head[to / bs_];
        if (r.block.use_count() > 1) r.block = std::make_shared<std::vector<Token>>(*r.block);
        (*r.block)[to % bs_] = tokens[from];
      }
      head.resize((k + bs_ - 1) / bs_);
      if (!head.empty()) head.back().count = k - (static_cast<int>(head.size()) - 1) * bs_;
    }
    CheckSequence(id);
  }

  void OpFree(SequenceId id) {
    ASSERT_TRUE(bm_->FreeSequence(id).ok());
    model_.erase(id);
  }

  void Run(uint32_t seed, int ops) {
    rng_.seed(seed);
    for (int op = 0; op < ops; ++op) {
      free_ = kNumBlocks - 1 - UsedBlocks(false);
      host_free_ = kHostBlocks - 1 - UsedBlocks(true);
      const int r = rng_() % 100;
      if (model_.empty() || r < 10) {
        OpAdd();
      } else if (r < 60) {
        OpAppend(PickLive());
      } else if (r < 65) {
        OpFork(PickLive());
      } else if (r < 73) {
        OpSwap(PickLive());
      } else if (r < 88) {
        OpKeepSets(PickLive());
      } else if (r < 96) {
        OpFree(PickLive());
      } else {
        EXPECT_EQ(bm_->AppendToken(next_id_ + 1000).code(), absl::StatusCode::kInvalidArgument);
      }
      if (HasFatalFailure()) return;
      absl::Status integrity = bm_->VerifyIntegrity();
      ASSERT_TRUE(integrity.ok()) << integrity << " after op " << op;
      ASSERT_EQ(bm_->NumFreeBlocks(), kNumBlocks - 1 - UsedBlocks(false)) << "op " << op;
      ASSERT_EQ(bm_->NumFreeHostBlocks(), kHostBlocks - 1 - UsedBlocks(true)) << "op " << op;
      ASSERT_EQ(bm_->NumSequences(), static_cast<int>(model_.size()));
      if (op % 500 == 0)
        for (const auto& [id, s] : model_) CheckSequence(id);
      if (HasFatalFailure()) return;
    }
    for (const auto& [id, s] : model_) CheckSequence(id);
    for (SequenceId id : bm_->SequenceIds()) ASSERT_TRUE(bm_->FreeSequence(id).ok());
    EXPECT_EQ(bm_->NumFreeBlocks(), kNumBlocks - 1);
    EXPECT_EQ(bm_->NumFreeHostBlocks(), kHostBlocks - 1);
    EXPECT_GT(exhausted_, 0);
    EXPECT_GT(cow_compactions_, 0);
    EXPECT_GT(swaps_, 0);
    EXPECT_GT(forks_, 0);
    EXPECT_GT(blocks_freed_, 0);
    std::printf("exhausted %d, copy-on-write compactions %d, swaps %d, forks %d, freed %d\n",
                exhausted_, cow_compactions_, swaps_, forks_, blocks_freed_);
  }

  int bs_ = 0;
  std::unique_ptr<CpuKvStore> store_;
  std::unique_ptr<BlockManager> bm_;
  std::map<SequenceId, ModelSeq> model_;
  std::mt19937 rng_;
  SequenceId next_id_ = 1;
  int free_ = 0, host_free_ = 0;
  // What the run exercised; each must happen, or the generator has gone degenerate.
  int exhausted_ = 0, cow_compactions_ = 0, swaps_ = 0, forks_ = 0, blocks_freed_ = 0;
};

TEST_P(RandomOpsTest, MatchesTheModel) {
  const uint32_t seed = 1234u + GetParam();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", block_size " << GetParam());
  Run(seed, 26000);  // 4 block sizes x 26,000 = 104,000 operations
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, RandomOpsTest, ::testing::Values(1, 3, 8, 16));

}  // namespace
}  // namespace beaconkv
