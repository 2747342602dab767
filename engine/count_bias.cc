#include "engine/count_bias.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace beaconkv {
namespace {

// bias[j] = v wherever ids[j] == token, j < count. Branch-free and on its own (restrict, the
// count by value, not inlined into a loop that loses both) so that it vectorises: a match
// is rare and unpredictable.
__attribute__((noinline)) void SetWhereEqual(const int32_t* __restrict ids, int32_t count,
                                             int32_t token, float v, float* __restrict bias) {
  for (int32_t j = 0; j < count; ++j) bias[j] = ids[j] == token ? v : bias[j];
}

}  // namespace

void CountBias::PrefetchCounts(int32_t position, int32_t num_heads, TokenAt token_at) const {
  if (position < counted_) return;
  counts_.prefetch(token_at(position));
  const int32_t heads = std::min<int32_t>(num_heads, static_cast<int32_t>(heads_.size()));
  for (int32_t i = 0; i < heads; ++i) {
    const auto* state = reinterpret_cast<const char*>(&heads_[i]);
    for (size_t at = 0; at < sizeof(HeadState); at += 64) __builtin_prefetch(state + at);
  }
}

void CountBias::PrefetchHeads(const CpuKvStore& store, int32_t position, int32_t num_heads,
                              TokenAt token_at) const {
  if (position < counted_) return;
  const int32_t token = token_at(position);
  const int32_t heads = std::min<int32_t>(num_heads, static_cast<int32_t>(heads_.size()));
  for (int32_t i = 0; i < heads; ++i) {
    const HeadState& c = heads_[i];
    if (c.position != position - 1 || c.ids.empty()) continue;  // not an in-place update
    c.held.prefetch(token);
    __builtin_prefetch(c.ids.data());
    __builtin_prefetch(c.bias.data());
    store.PrefetchPosition(c.first_slot);
    store.PrefetchPosition(c.last_slot);
  }
}

absl::StatusOr<absl::Span<const float>> CountBias::Head(const BlockManager& bm,
                                                        const CpuKvStore& store, SequenceId id,
                                                        int32_t layer, int32_t kv_head,
                                                        int32_t position, TokenAt token_at) {
  const KvShape& shape = bm.shape();
  if (layer < 0 || layer >= shape.num_layers || kv_head < 0 || kv_head >= shape.num_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("count bias: no head (%d, %d) in a cache of %d layers x %d kv heads", layer,
                        kv_head, shape.num_layers, shape.num_kv_heads));
  }
  if (position < counted_ - 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("count bias: sequence %d asked at position %d after counting through %d",
                        id, position, counted_ - 1));
  }
  for (; counted_ <= position; ++counted_) ++counts_[token_at(counted_)];
  BKV_ASSIGN_OR_RETURN(const absl::Span<const BlockId> table, bm.BlockTable(id, layer, kv_head));
  BKV_ASSIGN_OR_RETURN(const int32_t n, bm.RetainedTokens(id, layer, kv_head));
  auto position_of = [&](int32_t j) {
    return store.position({table[j / shape.block_size], j % shape.block_size});
  };
  const size_t index = static_cast<size_t>(layer) * shape.num_kv_heads + kv_head;
  // Sized once, so that no head's terms move while a caller holds another head's span.
  if (heads_.empty()) heads_.resize(static_cast<size_t>(shape.num_heads_total()));
  HeadState& c = heads_[index];
  auto term = [&](int32_t token) {
    return std::log(static_cast<float>(counts_[token]) / static_cast<float>(c.held[token]));
  };
  const bool grown_by_one = c.position == position - 1 && n >= 2 &&
                            n == static_cast<int32_t>(c.ids.size()) + 1 &&
                            position_of(0) == c.first && position_of(n - 2) == c.last;
  if (grown_by_one) {
    const int32_t token = token_at(position_of(n - 1));
    c.ids.push_back(token);
    ++c.held[token];
    const float v = term(token);
    c.bias.push_back(v);
    SetWhereEqual(c.ids.data(), n - 1, token, v, c.bias.data());
  } else {
    c.ids.resize(n);
    c.held.clear();
    for (int32_t j = 0; j < n; ++j) ++c.held[c.ids[j] = token_at(position_of(j))];
    c.bias.resize(n);
    for (int32_t j = 0; j < n; ++j) c.bias[j] = term(c.ids[j]);
  }
  c.first = n > 0 ? position_of(0) : -1;
  c.last = n > 0 ? position_of(n - 1) : -1;
  if (n > 0) {
    c.first_slot = {table[0], 0};
    c.last_slot = {table[(n - 1) / shape.block_size], (n - 1) % shape.block_size};
  }
  c.position = position;
  return absl::MakeConstSpan(c.bias);
}

}  // namespace beaconkv
