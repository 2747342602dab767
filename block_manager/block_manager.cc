#include "block_manager/block_manager.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/status_macros.h"

namespace beaconkv {

absl::Status BlockManager::ValidateConfig(const BlockManagerConfig& config) {
  BKV_RETURN_IF_ERROR(config.shape.Validate());
  if (config.num_blocks < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_blocks=%d: the pool needs the null block and at least one more", config.num_blocks));
  }
  if (config.num_host_blocks < 0 || config.num_host_blocks == 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_host_blocks=%d: use 0 (no swap) or at least 2", config.num_host_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlockManager>> BlockManager::Create(const BlockManagerConfig& config,
                                                                   KvStore* store) {
  BKV_RETURN_IF_ERROR(ValidateConfig(config));
  if (auto* cpu = dynamic_cast<CpuKvStore*>(store); cpu != nullptr) {
    if (cpu->num_blocks() < config.num_blocks || cpu->block_size() != config.shape.block_size ||
        cpu->head_dim() != config.shape.head_dim) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KV store shape (blocks=%d, block_size=%d, head_dim=%d) does not fit the pool "
          "(blocks=%d, block_size=%d, head_dim=%d)",
          cpu->num_blocks(), cpu->block_size(), cpu->head_dim(), config.num_blocks,
          config.shape.block_size, config.shape.head_dim));
    }
  }
  return std::unique_ptr<BlockManager>(new BlockManager(config, store));
}

BlockManager::BlockManager(const BlockManagerConfig& config, KvStore* store)
    : shape_(config.shape),
      block_mask_((config.shape.block_size & (config.shape.block_size - 1)) == 0
                      ? config.shape.block_size - 1
                      : -1),
      store_(store),
      pool_(config.num_blocks),
      host_pool_(std::max(config.num_host_blocks, 1)) {
  if (config.num_host_blocks > 0 && store_ != nullptr) {
    host_store_ =
        std::make_unique<CpuKvStore>(config.num_host_blocks, shape_.block_size, shape_.head_dim);
  }
}

absl::StatusOr<BlockManager::Sequence*> BlockManager::Find(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end())
    return absl::InvalidArgumentError(absl::StrFormat("unknown sequence id %d", id));
  return &it->second;
}

absl::StatusOr<const BlockManager::Sequence*> BlockManager::Find(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end())
    return absl::InvalidArgumentError(absl::StrFormat("unknown sequence id %d", id));
  return &it->second;
}

absl::StatusOr<BlockManager::Sequence*> BlockManager::FindResident(SequenceId id, const char* op) {
  BKV_ASSIGN_OR_RETURN(Sequence * seq, Find(id));
  if (seq->swapped) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot %s sequence %d: it is swapped out", op, id));
  }
  return seq;
}

absl::Status BlockManager::CheckHead(int32_t layer, int32_t kv_head) const {
  if (layer < 0 || layer >= shape_.num_layers || kv_head < 0 || kv_head >= shape_.num_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("no head (layer %d, kv_head %d): the cache has %d layers x %d kv_heads",
                        layer, kv_head, shape_.num_layers, shape_.num_kv_heads));
  }
  return absl::OkStatus();
}

absl::Status BlockManager::AddSequence(SequenceId id, int32_t prompt_len) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (sequences_.contains(id))
    return absl::InvalidArgumentError(absl::StrFormat("sequence id %d already exists", id));
  if (prompt_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d: prompt length %d, must be >= 1", id, prompt_len));
  }
  const int32_t per_head = shape_.BlocksFor(prompt_len);
  const int32_t heads = shape_.num_heads_total();
  const int64_t needed = static_cast<int64_t>(per_head) * heads;
  if (needed > pool_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of KV blocks adding sequence %d (prompt %d tokens): needed %d, %d free of %d", id,
        prompt_len, needed, pool_.num_free(), pool_.num_usable()));
  }
  Sequence seq;
  seq.prompt_len = prompt_len;
  seq.next_position = prompt_len;
  seq.num_tokens.assign(heads, prompt_len);
  seq.blocks.resize(heads);
  for (int32_t h = 0; h < heads; ++h) {
    seq.blocks[h].reserve(per_head + 1);
    for (int32_t i = 0; i < per_head; ++i) seq.blocks[h].push_back(pool_.TakeReserved());
    if (store_ != nullptr) {
      for (int32_t p = 0; p < prompt_len; ++p) {
        store_->SetPosition({seq.blocks[h][p / shape_.block_size], p % shape_.block_size}, p);
      }
    }
  }
  sequences_.emplace(id, std::move(seq));
  return absl::OkStatus();
}

int32_t BlockManager::CountAppendBlocks(const Sequence& seq) const {
  int32_t needed = 0;
  const int32_t heads = shape_.num_heads_total();
  if (pool_.num_shared() == 0) {  // no forks anywhere: only full tails need a block
    for (int32_t h = 0; h < heads; ++h) needed += (OffsetInBlock(seq.num_tokens[h]) == 0);
    return needed;
  }
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t n = seq.num_tokens[h];
    needed += OffsetInBlock(n) == 0 || pool_.RefCount(seq.blocks[h].back()) > 1;
  }
  return needed;
}

absl::StatusOr<int32_t> BlockManager::BlocksNeededToAppend(SequenceId id) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  if (seq->swapped)
    return absl::FailedPreconditionError(absl::StrFormat("sequence %d is swapped out", id));
  return CountAppendBlocks(*seq);
}

absl::Status BlockManager::AppendToken(SequenceId id, absl::Span<SlotRef> slots_out) {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(Sequence * found, FindResident(id, "append to"));
  Sequence& seq = *found;
  const int32_t heads = shape_.num_heads_total();
  if (!slots_out.empty() && static_cast<int32_t>(slots_out.size()) != heads) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slots_out has %d entries, the cache has %d heads", slots_out.size(), heads));
  }
  const int32_t needed = CountAppendBlocks(seq);
  if (needed > pool_.num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out of KV blocks appending to sequence %d: needed %d, %d free of %d", id,
                        needed, pool_.num_free(), pool_.num_usable()));
  }
  const int32_t position = seq.next_position;
  const bool any_shared = pool_.num_shared() > 0;
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t n = seq.num_tokens[h];
    const int32_t offset = OffsetInBlock(n);
    std::vector<BlockId>& table = seq.blocks[h];
    if (offset == 0) {
      table.push_back(pool_.TakeReserved());
    } else if (any_shared && pool_.RefCount(table.back()) > 1) {
      const BlockId fresh = pool_.TakeReserved();
      if (store_ != nullptr) {
        const BlockCopy copy{table.back(), fresh};
        store_->CopyBlocks({&copy, 1});
      }
      pool_.Release(table.back());
      table.back() = fresh;
    }
    seq.num_tokens[h] = n + 1;
    if (store_ != nullptr || !slots_out.empty()) {
      const SlotRef slot{table.back(), offset};
      if (store_ != nullptr) store_->SetPosition(slot, position);
      if (!slots_out.empty()) slots_out[h] = slot;
    }
  }
  seq.next_position = position + 1;
  return absl::OkStatus();
}

absl::Status BlockManager::Fork(SequenceId parent, SequenceId child) {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(Sequence * found, FindResident(parent, "fork"));
  if (sequences_.contains(child))
    return absl::InvalidArgumentError(absl::StrFormat("sequence id %d already exists", child));
  Sequence copy = *found;
  for (const std::vector<BlockId>& table : copy.blocks)
    for (BlockId b : table) pool_.AddRef(b);
  sequences_.emplace(child, std::move(copy));
  return absl::OkStatus();
}

void BlockManager::ReleaseAll(Sequence& seq, BlockPool& pool) {
  // Reverse table order, so that with the LIFO free list a new sequence of the same shape
  // receives these blocks in the order this one first took them.
  for (auto table = seq.blocks.rbegin(); table != seq.blocks.rend(); ++table) {
    for (auto b = table->rbegin(); b != table->rend(); ++b) pool.Release(*b);
    table->clear();
  }
}

absl::Status BlockManager::FreeSequence(SequenceId id) {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(Sequence * found, Find(id));
  ReleaseAll(*found, found->swapped ? host_pool_ : pool_);
  sequences_.erase(id);
  return absl::OkStatus();
}

absl::Status BlockManager::MoveBetweenPools(SequenceId id, Sequence& seq, bool to_host) {
  BlockPool& from = to_host ? pool_ : host_pool_;
  BlockPool& to = to_host ? host_pool_ : pool_;
  int32_t total = 0;
  for (const auto& table : seq.blocks) total += static_cast<int32_t>(table.size());
  std::vector<BlockId> dst_blocks;
  if (absl::Status s = to.TakeMany(total, &dst_blocks); !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out of %s blocks swapping %s sequence %d: needed %d, %d free of %d",
                        to_host ? "host" : "KV", to_host ? "out" : "in", id, total, to.num_free(),
                        to.num_usable()));
  }
  std::vector<BlockCopy> copies;
  copies.reserve(total);
  int32_t next = 0;
  for (auto& table : seq.blocks) {
    for (BlockId& b : table) {
      copies.push_back({b, dst_blocks[next++]});
      b = copies.back().dst;
    }
  }
  // A sequence evicted down to no blocks moves nothing, and may have no host store to name.
  if (store_ != nullptr && !copies.empty()) {
    if (to_host) {
      store_->SwapOut(copies, *host_store_);
    } else {
      store_->SwapIn(copies, *host_store_);
    }
  }
  for (auto c = copies.rbegin(); c != copies.rend(); ++c) from.Release(c->src);
  seq.swapped = to_host;
  return absl::OkStatus();
}

absl::Status BlockManager::SwapOut(SequenceId id) {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(Sequence * seq, FindResident(id, "swap out"));
  return MoveBetweenPools(id, *seq, /*to_host=*/true);
}

absl::Status BlockManager::SwapIn(SequenceId id) {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(Sequence * seq, Find(id));
  if (!seq->swapped) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot swap in sequence %d: it is not swapped out", id));
  }
  return MoveBetweenPools(id, *seq, /*to_host=*/false);
}

absl::StatusOr<CompactionPlan> BlockManager::ApplyKeepSets(SequenceId id,
                                                           absl::Span<const KeepSet> keep) {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(Sequence * found, FindResident(id, "compact"));
  Sequence& seq = *found;
  const int32_t bs = shape_.block_size;

  // Validate and plan every head before touching anything.
  CompactionPlan plan;
  plan.heads.resize(keep.size());
  absl::flat_hash_set<int32_t> heads_seen;
  for (size_t i = 0; i < keep.size(); ++i) {
    const KeepSet& ks = keep[i];
    BKV_RETURN_IF_ERROR(CheckHead(ks.layer, ks.kv_head));
    const int32_t h = shape_.HeadIndex(ks.layer, ks.kv_head);
    if (!heads_seen.insert(h).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "keep-sets name head (layer %d, kv_head %d) twice", ks.layer, ks.kv_head));
    }
    BKV_RETURN_IF_ERROR(PlanHeadCompaction(h, seq.num_tokens[h], ks.slots, &plan.heads[i]));
  }
  // Blocks that receive survivors must be private: count the shared ones to copy first.
  std::vector<std::pair<int32_t, int32_t>> to_copy;  // (head, block index in table)
  for (const HeadCompaction& hc : plan.heads) {
    int32_t last = -1;
    for (const IndexMove& m : hc.moves) {
      const int32_t bi = m.to / bs;
      if (bi != last && pool_.RefCount(seq.blocks[hc.head][bi]) > 1)
        to_copy.push_back({hc.head, bi});
      last = bi;
    }
  }
  if (static_cast<int32_t>(to_copy.size()) > pool_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of KV blocks compacting sequence %d: needed %d for copy-on-write, %d free of %d", id,
        to_copy.size(), pool_.num_free(), pool_.num_usable()));
  }
  for (auto [h, bi] : to_copy) {
    BlockId& b = seq.blocks[h][bi];
    plan.copies.push_back({b, pool_.TakeReserved()});
    pool_.Release(b);
    b = plan.copies.back().dst;
  }
  if (store_ != nullptr && !plan.copies.empty()) store_->CopyBlocks(plan.copies);

  for (const HeadCompaction& hc : plan.heads) {
    std::vector<BlockId>& table = seq.blocks[hc.head];
    for (const IndexMove& m : hc.moves) {
      plan.moves.push_back({{table[m.from / bs], m.from % bs}, {table[m.to / bs], m.to % bs}});
    }
    plan.tokens_evicted += hc.old_num_tokens - hc.new_num_tokens;
  }
  if (store_ != nullptr && !plan.moves.empty()) store_->MoveSlots(plan.moves);

  for (const HeadCompaction& hc : plan.heads) {
    std::vector<BlockId>& table = seq.blocks[hc.head];
    const size_t keep_blocks = shape_.BlocksFor(hc.new_num_tokens);
    while (table.size() > keep_blocks) {
      ++plan.blocks_released;
      plan.blocks_freed += pool_.Release(table.back());
      table.pop_back();
    }
    seq.num_tokens[hc.head] = hc.new_num_tokens;
  }
  return plan;
}

int32_t BlockManager::NumFreeBlocks() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return pool_.num_free();
}

int32_t BlockManager::NumUsedBlocks() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return pool_.num_used();
}

int32_t BlockManager::NumFreeHostBlocks() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return host_pool_.num_free();
}

int32_t BlockManager::NumSequences() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(sequences_.size());
}

bool BlockManager::HasSequence(SequenceId id) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return sequences_.contains(id);
}

std::vector<BlockId> BlockManager::FreeList() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return pool_.FreeList();
}

double BlockManager::Usage() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return static_cast<double>(pool_.num_used()) / pool_.num_usable();
}

absl::StatusOr<bool> BlockManager::IsSwappedOut(SequenceId id) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  return seq->swapped;
}

absl::StatusOr<int32_t> BlockManager::NumBlocksOf(SequenceId id) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  int32_t total = 0;
  for (const auto& table : seq->blocks) total += static_cast<int32_t>(table.size());
  return total;
}

absl::StatusOr<int32_t> BlockManager::RetainedTokens(SequenceId id, int32_t layer,
                                                     int32_t kv_head) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  BKV_RETURN_IF_ERROR(CheckHead(layer, kv_head));
  return seq->num_tokens[shape_.HeadIndex(layer, kv_head)];
}

absl::Status BlockManager::RetainedTokensOfHeads(SequenceId id, absl::Span<int32_t> out) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  if (static_cast<int64_t>(out.size()) != shape_.num_heads_total()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("retained tokens of sequence %d: room for %d heads, the shape has %d", id,
                        out.size(), shape_.num_heads_total()));
  }
  std::copy(seq->num_tokens.begin(), seq->num_tokens.end(), out.begin());
  return absl::OkStatus();
}

absl::StatusOr<int32_t> BlockManager::NextPosition(SequenceId id) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  return seq->next_position;
}

absl::StatusOr<int32_t> BlockManager::PromptLength(SequenceId id) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  return seq->prompt_len;
}

absl::StatusOr<absl::Span<const BlockId>> BlockManager::BlockTable(SequenceId id, int32_t layer,
                                                                   int32_t kv_head) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  BKV_RETURN_IF_ERROR(CheckHead(layer, kv_head));
  return absl::MakeConstSpan(seq->blocks[shape_.HeadIndex(layer, kv_head)]);
}

absl::StatusOr<SlotRef> BlockManager::Slot(SequenceId id, int32_t layer, int32_t kv_head,
                                           int32_t index) const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  BKV_RETURN_IF_ERROR(CheckHead(layer, kv_head));
  const int32_t h = shape_.HeadIndex(layer, kv_head);
  const int32_t n = seq->num_tokens[h];
  if (index < 0 || index >= n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("slot %d of sequence %d head (layer %d, kv_head %d) is outside [0, %d)",
                        index, id, layer, kv_head, n));
  }
  return SlotRef{seq->blocks[h][index / shape_.block_size], index % shape_.block_size};
}

double BlockManager::Fragmentation() const {
  const std::lock_guard<std::mutex> lock(mu_);
  // A shared block holds the same tokens for every owner, so count each block once.
  absl::flat_hash_map<BlockId, int32_t> filled;
  for (const auto& [id, seq] : sequences_) {
    if (seq.swapped) continue;
    for (size_t h = 0; h < seq.blocks.size(); ++h) {
      const auto& table = seq.blocks[h];
      for (size_t i = 0; i < table.size(); ++i) {
        const int32_t in_block =
            std::min<int32_t>(shape_.block_size, seq.num_tokens[h] - i * shape_.block_size);
        int32_t& f = filled[table[i]];
        f = std::max(f, in_block);
      }
    }
  }
  if (filled.empty()) return 0.0;
  int64_t retained = 0;
  for (const auto& [b, f] : filled) retained += f;
  const int64_t allocated = static_cast<int64_t>(filled.size()) * shape_.block_size;
  return static_cast<double>(allocated - retained) / allocated;
}

std::vector<SequenceId> BlockManager::SequenceIds() const {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<SequenceId> ids;
  ids.reserve(sequences_.size());
  for (const auto& [id, seq] : sequences_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::Status BlockManager::VerifyIntegrity() const {
  const std::lock_guard<std::mutex> lock(mu_);
  BKV_RETURN_IF_ERROR(pool_.VerifyIntegrity());
  BKV_RETURN_IF_ERROR(host_pool_.VerifyIntegrity());
  std::vector<int32_t> refs(pool_.num_blocks(), 0), host_refs(host_pool_.num_blocks(), 0);
  std::vector<int32_t> owner(pool_.num_blocks(), -1), host_owner(host_pool_.num_blocks(), -1);
  const int32_t heads = shape_.num_heads_total();
  for (const auto& [id, seq] : sequences_) {
    if (static_cast<int32_t>(seq.num_tokens.size()) != heads ||
        static_cast<int32_t>(seq.blocks.size()) != heads) {
      return absl::InternalError(absl::StrFormat("sequence %d has wrong head count", id));
    }
    if (seq.prompt_len > seq.next_position)
      return absl::InternalError(absl::StrFormat("sequence %d: prompt past next position", id));
    auto& r = seq.swapped ? host_refs : refs;
    auto& o = seq.swapped ? host_owner : owner;
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t n = seq.num_tokens[h];
      if (n < 0 || n > seq.next_position) {
        return absl::InternalError(absl::StrFormat("sequence %d head %d holds %d tokens of %d", id,
                                                   h, n, seq.next_position));
      }
      if (static_cast<int32_t>(seq.blocks[h].size()) != shape_.BlocksFor(n)) {
        return absl::InternalError(
            absl::StrFormat("sequence %d head %d: %d tokens in %d blocks (not a dense prefix)", id,
                            h, n, seq.blocks[h].size()));
      }
      for (BlockId b : seq.blocks[h]) {
        if (b <= kNullBlock || b >= static_cast<BlockId>(r.size()))
          return absl::InternalError(absl::StrFormat("sequence %d holds invalid block %d", id, b));
        ++r[b];
        if (o[b] != -1 && o[b] != h) {
          return absl::InternalError(
              absl::StrFormat("block %d belongs to heads %d and %d", b, o[b], h));
        }
        o[b] = h;
      }
    }
  }
  for (BlockId b = 1; b < pool_.num_blocks(); ++b) {
    if (refs[b] != pool_.RefCount(b)) {
      return absl::InternalError(absl::StrFormat("block %d: refcount %d but %d table references", b,
                                                 pool_.RefCount(b), refs[b]));
    }
  }
  for (BlockId b = 1; b < host_pool_.num_blocks(); ++b) {
    if (host_refs[b] != host_pool_.RefCount(b)) {
      return absl::InternalError(absl::StrFormat("host block %d: refcount %d but %d references", b,
                                                 host_pool_.RefCount(b), host_refs[b]));
    }
  }
  return absl::OkStatus();
}

}  // namespace beaconkv
