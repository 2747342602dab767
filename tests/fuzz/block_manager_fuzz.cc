// libFuzzer target: the block-manager API driven by an operation sequence decoded from the
// input, checked after every operation against the simple model of
// tests/cpp/block_manager_random_test.cc (blocks are shared_ptrs to token lists, sharing is
// their use_count, nothing is reused): the status the model predicts, VerifyIntegrity(), free
// block counts, and every retained token's position and K/V bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "block_manager/block_manager.h"
#include "tests/fuzz/fuzz_check.h"

namespace beaconkv {
namespace {

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 2, kHeadsTotal = kLayers * kHeads;

struct Token {
  SequenceId origin;
  int32_t position;
  bool operator==(const Token&) const = default;
};
using ModelBlock = std::shared_ptr<std::vector<Token>>;
struct ModelRef {
  ModelBlock block;
  int count = 0;
};
struct ModelSeq {
  int32_t next_position = 0;
  bool swapped = false;
  std::vector<std::vector<ModelRef>> heads;  // [heads][blocks]
};

float Encode(const Token& t, int head, int d) {
  return static_cast<float>(t.origin % 64) * 4096.0f + head * 1024.0f + t.position + d * 0.25f;
}

class Harness {
 public:
  Harness(int bs, int num_blocks, int host_blocks)
      : bs_(bs), num_blocks_(num_blocks), host_blocks_(host_blocks) {
    BlockManagerConfig c;
    c.shape = {kLayers, kHeads, kHeadDim, bs};
    c.num_blocks = num_blocks;
    c.num_host_blocks = host_blocks;
    store_ = std::make_unique<CpuKvStore>(num_blocks, bs, kHeadDim);
    auto bm = BlockManager::Create(c, store_.get());
    FUZZ_CHECK(bm.ok());
    bm_ = *std::move(bm);
  }

  void Step(FuzzedDataProvider& in) {
    free_ = num_blocks_ - 1 - UsedBlocks(false);
    host_free_ = host_blocks_ == 0 ? 0 : host_blocks_ - 1 - UsedBlocks(true);
    const int op = in.ConsumeIntegralInRange<int>(0, 7);
    if (model_.empty() || op == 0) {
      Add(in.ConsumeIntegralInRange<int>(0, 3 * bs_ + 2));
    } else {
      const SequenceId id = Pick(in.ConsumeIntegral<uint8_t>());
      switch (op) {
        case 1:
        case 2:
          Append(id);
          break;
        case 3:
          Fork(id);
          break;
        case 4:
          Swap(id);
          break;
        case 5:
          KeepSets(id, in);
          break;
        case 6:
          FUZZ_CHECK(bm_->FreeSequence(id).ok());
          model_.erase(id);
          break;
        default:
          FUZZ_CHECK(bm_->AppendToken(next_id_ + 1000).code() ==
                     absl::StatusCode::kInvalidArgument);
      }
    }
    FUZZ_CHECK(bm_->VerifyIntegrity().ok());
    FUZZ_CHECK(bm_->NumFreeBlocks() == num_blocks_ - 1 - UsedBlocks(false));
    if (host_blocks_ > 0)
      FUZZ_CHECK(bm_->NumFreeHostBlocks() == host_blocks_ - 1 - UsedBlocks(true));
    FUZZ_CHECK(bm_->NumSequences() == static_cast<int>(model_.size()));
  }

  void Finish() {
    for (const auto& [id, s] : model_) CheckSequence(id);
    for (SequenceId id : bm_->SequenceIds()) FUZZ_CHECK(bm_->FreeSequence(id).ok());
    FUZZ_CHECK(bm_->NumFreeBlocks() == num_blocks_ - 1);
    FUZZ_CHECK(bm_->VerifyIntegrity().ok());
  }

 private:
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
  SequenceId Pick(uint8_t r) const {
    auto it = model_.begin();
    std::advance(it, r % model_.size());
    return it->first;
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
    for (int h = 0; h < kHeadsTotal; ++h) {
      const std::vector<Token> want = Tokens(s.heads[h]);
      FUZZ_CHECK(*bm_->RetainedTokens(id, h / kHeads, h % kHeads) == static_cast<int>(want.size()));
      if (s.swapped) continue;
      for (int i = 0; i < static_cast<int>(want.size()); ++i) {
        const SlotRef slot = *bm_->Slot(id, h / kHeads, h % kHeads, i);
        FUZZ_CHECK(store_->position(slot) == want[i].position);
        for (int d = 0; d < kHeadDim; ++d) {
          FUZZ_CHECK(store_->key(slot)[d] == Encode(want[i], h, d));
          FUZZ_CHECK(store_->value(slot)[d] == -Encode(want[i], h, d));
        }
      }
    }
  }

  void Add(int prompt) {
    const SequenceId id = next_id_++;
    const absl::Status st = bm_->AddSequence(id, prompt);
    if (prompt < 1) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
      return;
    }
    if (kHeadsTotal * ((prompt + bs_ - 1) / bs_) > free_) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kResourceExhausted);
      return;
    }
    FUZZ_CHECK(st.ok());
    ModelSeq s;
    s.next_position = prompt;
    s.heads.resize(kHeadsTotal);
    for (int h = 0; h < kHeadsTotal; ++h) {
      for (int p = 0; p < prompt; ++p) {
        if (p % bs_ == 0) s.heads[h].push_back({std::make_shared<std::vector<Token>>(), 0});
        s.heads[h].back().block->push_back({id, p});
        s.heads[h].back().count++;
        WriteBytes(id, h, p, {id, p});
      }
    }
    model_[id] = std::move(s);
  }

  void Append(SequenceId id) {
    ModelSeq& s = model_.at(id);
    const absl::Status st = bm_->AppendToken(id);
    if (s.swapped) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
      return;
    }
    int need = 0;
    for (const auto& head : s.heads)
      need += head.empty() || head.back().count == bs_ || head.back().block.use_count() > 1;
    if (need > free_) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kResourceExhausted);
      return;
    }
    FUZZ_CHECK(st.ok());
    const Token t{id, s.next_position++};
    for (int h = 0; h < kHeadsTotal; ++h) {
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

  void Fork(SequenceId parent) {
    const SequenceId child = next_id_++;
    const absl::Status st = bm_->Fork(parent, child);
    if (model_.at(parent).swapped) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
      return;
    }
    FUZZ_CHECK(st.ok());
    model_[child] = model_.at(parent);
  }

  void Swap(SequenceId id) {
    ModelSeq& s = model_.at(id);
    int need = 0;
    for (const auto& head : s.heads) need += static_cast<int>(head.size());
    const absl::Status st = s.swapped ? bm_->SwapIn(id) : bm_->SwapOut(id);
    if (need > (s.swapped ? free_ : host_free_)) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kResourceExhausted);
      return;
    }
    FUZZ_CHECK(st.ok());
    for (auto& head : s.heads)
      for (auto& r : head) r.block = std::make_shared<std::vector<Token>>(*r.block);
    s.swapped = !s.swapped;
    CheckSequence(id);
  }

  void KeepSets(SequenceId id, FuzzedDataProvider& in) {
    ModelSeq& s = model_.at(id);
    std::vector<KeepSet> sets;
    std::set<int> named;
    const int count = in.ConsumeIntegralInRange<int>(0, kHeadsTotal);
    bool invalid = false;
    for (int i = 0; i < count; ++i) {
      const int h = in.ConsumeIntegralInRange<int>(0, kHeadsTotal - 1);
      invalid |= !named.insert(h).second;  // a head named twice
      const int n = NumTokens(s.heads[h]);
      KeepSet ks{h / kHeads, h % kHeads, {}};
      // A bitmask over the head's slots, then possibly one bad slot (out of range or a repeat).
      for (int t = 0; t < n; ++t)
        if (in.ConsumeBool()) ks.slots.push_back(t);
      if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
        ks.slots.push_back(ks.slots.empty() || in.ConsumeBool() ? n + 3 : ks.slots.front());
        invalid = true;
      }
      sets.push_back(std::move(ks));
    }
    absl::StatusOr<CompactionPlan> plan = bm_->ApplyKeepSets(id, sets);
    if (s.swapped) {
      FUZZ_CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
      return;
    }
    if (invalid) {
      FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
      return;
    }
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
      FUZZ_CHECK(plan.status().code() == absl::StatusCode::kResourceExhausted);
      return;
    }
    FUZZ_CHECK(plan.ok());
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

  int bs_, num_blocks_, host_blocks_;
  std::unique_ptr<CpuKvStore> store_;
  std::unique_ptr<BlockManager> bm_;
  std::map<SequenceId, ModelSeq> model_;
  SequenceId next_id_ = 1;
  int free_ = 0, host_free_ = 0;
};

}  // namespace
}  // namespace beaconkv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static constexpr int kBlockSizes[] = {1, 2, 3, 4, 8};
  const int bs = kBlockSizes[in.ConsumeIntegralInRange<int>(0, 4)];
  const int num_blocks = in.ConsumeIntegralInRange<int>(2, 80);
  const int host = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int>(2, 80);
  beaconkv::Harness h(bs, num_blocks, host);
  for (int ops = 0; in.remaining_bytes() > 0 && ops < 200; ++ops) h.Step(in);
  h.Finish();
  return 0;
}
