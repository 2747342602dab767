#include "core/policy.h"

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <variant>

#include "absl/strings/str_format.h"
#include "core/beacon_bank.h"
#include "core/check.h"
#include "core/policy_internal.h"
#include "core/selection.h"
#include "core/status_macros.h"

namespace beaconkv {

absl::Status PolicyState::CheckHead(int32_t layer, int32_t kv_head) const {
  if (layer < 0 || layer >= geometry_.num_layers || kv_head < 0 ||
      kv_head >= geometry_.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy %s: (layer %d, kv_head %d) out of range for %d layers x %d kv heads", policy_name(),
        layer, kv_head, geometry_.num_layers, geometry_.num_kv_heads));
  }
  return absl::OkStatus();
}

absl::Status PolicyState::CheckStep(int32_t layer, int32_t kv_head, const StepQueries& step) const {
  BKV_RETURN_IF_ERROR(CheckHead(layer, kv_head));
  if (step.pre_rope == nullptr || step.post_rope == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy %s: (layer %d, kv_head %d) step at position %d has no pre-/post-RoPE queries",
        policy_name(), layer, kv_head, step.position));
  }
  return absl::OkStatus();
}

absl::Status PolicyState::CheckKeys(int32_t layer, int32_t kv_head, const HeadKeys& keys,
                                    bool need_keys) const {
  if (keys.num_tokens < 0 ||
      (keys.num_tokens > 0 && ((need_keys && !keys.keys) || !keys.positions))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy %s: (layer %d, kv_head %d) keys need %d tokens of %s", policy_name(), layer,
        kv_head, keys.num_tokens, need_keys ? "keys and positions" : "positions"));
  }
  return absl::OkStatus();
}

absl::Status PolicyState::CheckCompressArgs(int32_t layer, absl::Span<const HeadKeys> heads,
                                            absl::Span<const int32_t> due, bool all_heads,
                                            bool need_keys) const {
  BKV_RETURN_IF_ERROR(CheckHead(layer, 0));
  if (static_cast<int32_t>(heads.size()) != geometry_.num_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("policy %s: layer %d: got keys of %d heads, expected num_kv_heads = %d",
                        policy_name(), layer, heads.size(), geometry_.num_kv_heads));
  }
  for (size_t i = 0; i < due.size(); ++i) {
    BKV_RETURN_IF_ERROR(CheckHead(layer, due[i]));
    if (i > 0 && due[i] <= due[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("policy %s: due heads must be ascending and unique", policy_name()));
    }
  }
  for (int32_t h = 0; h < geometry_.num_kv_heads; ++h) {
    const bool used = all_heads || std::binary_search(due.begin(), due.end(), h);
    if (!used) continue;
    BKV_RETURN_IF_ERROR(CheckKeys(layer, h, heads[h], need_keys));
  }
  return absl::OkStatus();
}

absl::StatusOr<ScoringPlan> PolicyState::PlanScoring(int32_t, absl::Span<const HeadKeys>,
                                                     absl::Span<const int32_t>, int32_t) {
  return absl::UnimplementedError(absl::StrFormat(
      "policy %s: its selection cannot be handed to an external scorer; run Compress",
      policy_name()));
}

absl::StatusOr<std::vector<KeepSet>> PolicyState::SelectFromScores(
    const ScoringPlan&, absl::Span<const HeadKeys>, absl::Span<const absl::Span<const float>>) {
  return absl::UnimplementedError(absl::StrFormat(
      "policy %s: plans no pooled layer, so it has no selection from scores", policy_name()));
}

absl::Span<const int32_t> PolicyState::CoveredHeads(bool pooled, absl::Span<const int32_t> due,
                                                    std::vector<int32_t>* all) const {
  if (!pooled) return due;
  all->resize(geometry_.num_kv_heads);
  std::iota(all->begin(), all->end(), 0);
  return *all;
}

absl::StatusOr<ScoringPlan> PolicyState::PlanScored(int32_t layer, absl::Span<const HeadKeys> heads,
                                                    absl::Span<const int32_t> due,
                                                    const PlanHooks& hooks) const {
  const bool pooled = hooks.mode == BudgetMode::kPooled;
  BKV_RETURN_IF_ERROR(CheckCompressArgs(layer, heads, due, /*all_heads=*/pooled,
                                        /*need_keys=*/false));
  std::vector<int32_t> all;
  due = CoveredHeads(pooled, due, &all);
  ScoringPlan plan = hooks.shape;
  plan.layer = layer;
  plan.pooled = pooled;
  plan.tasks.clear();
  for (int32_t h : due) {
    const OrderedHead ordered(HeadKeys{nullptr, heads[h].positions, heads[h].num_tokens},
                              geometry_.head_dim());
    const int32_t n = ordered.size();
    // A head within budget keeps everything, as CompressScored's selection does; pooled, the
    // layer's selection needs every head's scores.
    if (!pooled && n <= hooks.budget) continue;
    std::vector<uint8_t> protect;
    hooks.protect(h, ordered, &protect);
    if (protect.empty()) protect.assign(n, 0);
    ScoringTask task;
    task.kv_head = h;
    task.num_queries = hooks.rows(h, ordered, &protect, &task);
    const int64_t kept = std::count(protect.begin(), protect.end(), uint8_t{1});
    task.k = pooled ? 0 : std::max<int64_t>(hooks.budget - kept, 0);
    task.protect.assign(n, 0);
    for (int32_t i = 0; i < n; ++i) task.protect[ordered.slot(i)] = protect[i];
    if (!task.reserve.empty()) {
      BKV_CHECK(static_cast<int32_t>(task.reserve.size()) == n);
      std::vector<uint8_t> by_slot(n, 0);
      for (int32_t i = 0; i < n; ++i) by_slot[ordered.slot(i)] = task.reserve[i];
      task.reserve = std::move(by_slot);
    }
    plan.tasks.push_back(std::move(task));
  }
  return plan;
}

absl::StatusOr<std::vector<KeepSet>> KeepSetsFromMasks(
    const ScoringPlan& plan, absl::Span<const absl::Span<const uint8_t>> keep) {
  if (keep.size() != plan.tasks.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("scoring plan of layer %d: %d keep masks for %d tasks", plan.layer,
                        keep.size(), plan.tasks.size()));
  }
  std::vector<KeepSet> out;
  out.reserve(keep.size());
  for (size_t t = 0; t < keep.size(); ++t) {
    const ScoringTask& task = plan.tasks[t];
    if (static_cast<int64_t>(keep[t].size()) != task.num_tokens()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "scoring plan of layer %d, kv_head %d: keep mask of %d slots for %d tokens", plan.layer,
          task.kv_head, keep[t].size(), task.num_tokens()));
    }
    KeepSet ks{plan.layer, task.kv_head, {}};
    for (int32_t i = 0; i < task.num_tokens(); ++i) {
      if (keep[t][i]) ks.slots.push_back(i);
    }
    out.push_back(std::move(ks));
  }
  return out;
}

absl::StatusOr<std::vector<KeepSet>> PolicyState::CompressScored(int32_t layer,
                                                                 absl::Span<const HeadKeys> heads,
                                                                 absl::Span<const int32_t> due,
                                                                 const ScoringHooks& hooks,
                                                                 bool need_keys) const {
  const bool pooled = hooks.mode == BudgetMode::kPooled;
  BKV_RETURN_IF_ERROR(CheckCompressArgs(layer, heads, due, pooled, need_keys));
  std::vector<int32_t> all;
  due = CoveredHeads(pooled, due, &all);
  std::vector<internal::ScoredHead> scored;
  scored.reserve(due.size());
  for (int32_t h : due) {
    internal::ScoredHead sh;
    sh.kv_head = h;
    sh.ordered = std::make_unique<OrderedHead>(heads[h], geometry_.head_dim());
    const int32_t n = sh.ordered->size();
    sh.scores.assign(n, 0.0f);
    hooks.protect(h, *sh.ordered, &sh.protect);
    if (sh.protect.empty()) sh.protect.assign(n, 0);
    if (pooled || n > hooks.budget)
      hooks.score(h, *sh.ordered, absl::MakeSpan(sh.protect), absl::MakeSpan(sh.scores));
    scored.push_back(std::move(sh));
  }
  return internal::SelectScoredHeads(layer, scored, hooks.mode, hooks.budget);
}

std::optional<HeadTrigger> BudgetTrigger(const PolicyConfig& config) {
  return std::visit(
      [&](const auto& c) -> std::optional<HeadTrigger> {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, FullConfig> || std::is_same_v<C, RpcConfig>) {
          return std::nullopt;
        } else {
          HeadTrigger t{c.budget, c.interval, false, {}};
          if constexpr (requires { c.budget_mode; }) {
            t.pooled = c.budget_mode == BudgetMode::kPooled;
          }
          if constexpr (requires { c.layer_budget_offsets; }) {
            t.layer_offsets = c.layer_budget_offsets;
          }
          return t;
        }
      },
      config);
}

namespace {

// The most blocks `heads` heads holding `tokens` tokens together take: one partial block each.
int64_t SplitBlocks(int64_t tokens, int64_t heads, int64_t block_size) {
  return (tokens + heads * (block_size - 1)) / block_size;
}

}  // namespace

std::optional<int64_t> PeakBlocks(const PolicyConfig& config, const KvShape& shape,
                                  int32_t prefill_len, int64_t max_total) {
  const std::optional<HeadTrigger> t = BudgetTrigger(config);
  if (!t) return std::nullopt;
  // Due once a head (a layer, pooled) holds budget + interval per head; the first decode step
  // follows the prefill. No head holds more tokens than the sequence has.
  const int64_t cap = std::max<int64_t>(max_total, prefill_len);
  const int64_t first = std::min<int64_t>(cap, int64_t{prefill_len} + 1);
  const int64_t h = shape.num_kv_heads;
  int64_t blocks = 0;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const int64_t due = std::min<int64_t>(cap, t->BudgetOf(l) + t->interval);
    if (!t->pooled) {
      blocks += h * shape.BlocksFor(std::max(first, due));
      continue;
    }
    // The prefill and its first decode token are in every head alike; after a compression
    // the layer's heads hold up to `due` each together, split any way, none more than `cap`.
    const int64_t cycle =
        std::min<int64_t>(h * shape.BlocksFor(cap), SplitBlocks(h * due, h, shape.block_size));
    blocks += std::max<int64_t>(h * shape.BlocksFor(first), cycle);
  }
  return blocks;
}

bool AddBlockDemand(const PolicyConfig& config, const KvShape& shape, const HeadOutlook& seq,
                    absl::Span<int64_t> demand) {
  const std::optional<HeadTrigger> t = BudgetTrigger(config);
  if (!t || demand.empty()) return t.has_value();
  const int64_t bs = shape.block_size, h = shape.num_kv_heads;
  const int64_t last = std::min<int64_t>(static_cast<int64_t>(demand.size()) - 1,
                                         std::max<int64_t>(0, seq.steps_left));
  BKV_CHECK(h > 0 && static_cast<int64_t>(seq.head_tokens.size()) % h == 0);
  for (size_t first = 0; first < seq.head_tokens.size(); first += h) {
    const absl::Span<const int32_t> layer = seq.head_tokens.subspan(first, h);
    const int64_t budget = t->BudgetOf(static_cast<int32_t>(first / h));
    const int64_t due = budget + t->interval;
    if (!t->pooled) {
      for (const int32_t held : layer) {
        int64_t c = held;
        demand[0] += (c + bs - 1) / bs;
        if (seq.compresses_now && c >= due) c = budget;
        for (int64_t k = 1; k <= last; ++k) {
          ++c;
          demand[k] += (c + bs - 1) / bs;
          if (c >= due) c = budget;
        }
      }
      continue;
    }
    // Pooled: the layer's heads advance together and compress together once the layer holds
    // due * h tokens; after a compression only the layer's total is known.
    int64_t total = 0, exact_blocks = 0;
    for (const int32_t held : layer) {
      total += held;
      exact_blocks += (held + bs - 1) / bs;
    }
    demand[0] += exact_blocks;
    bool split_known = true;  // every head still holds its tokens of now plus one per step
    if (seq.compresses_now && total >= due * h) {
      total = budget * h;
      split_known = false;
    }
    for (int64_t k = 1; k <= last; ++k) {
      total += h;
      if (split_known) {
        exact_blocks = 0;
        for (const int32_t held : layer) exact_blocks += (held + k + bs - 1) / bs;
        demand[k] += exact_blocks;
      } else {
        demand[k] += SplitBlocks(total, h, bs);
      }
      if (total >= due * h) {
        total = budget * h;
        split_known = false;
      }
    }
  }
  return true;
}

std::optional<int64_t> BlockDemandHorizon(const PolicyConfig& config) {
  const std::optional<HeadTrigger> t = BudgetTrigger(config);
  if (!t) return std::nullopt;
  int64_t budget = t->budget;  // the largest layer budget: every layer is in its cycle by then
  for (size_t l = 0; l < t->layer_offsets.size(); ++l)
    budget = std::max(budget, t->BudgetOf(static_cast<int32_t>(l)));
  return budget + 2 * t->interval + 1;  // steps 0 .. budget + 2 * interval
}

absl::Status ValidatePolicyGeometry(const PolicyConfig& config, const PolicyGeometry& geometry) {
  BKV_RETURN_IF_ERROR(ValidatePolicyConfig(config));
  BKV_RETURN_IF_ERROR(geometry.rope.Validate());
  if (geometry.num_layers < 1 || geometry.num_kv_heads < 1 || geometry.group_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy geometry: num_layers=%d num_kv_heads=%d group_size=%d must all be >= 1",
        geometry.num_layers, geometry.num_kv_heads, geometry.group_size));
  }
  const auto* b = std::get_if<BeaconConfig>(&config);
  if (b == nullptr) return absl::OkStatus();
  if (!b->layer_budget_offsets.empty() &&
      static_cast<int32_t>(b->layer_budget_offsets.size()) != geometry.num_layers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy beacon: layer_budget_offsets has %d entries for a model of %d layers",
        b->layer_budget_offsets.size(), geometry.num_layers));
  }
  for (const int32_t l : b->blur_layers) {
    if (l >= geometry.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrFormat("policy beacon: blur_layers names layer %d of a model of %d layers", l,
                          geometry.num_layers));
    }
  }
  if (geometry.head_dim() > kMaxFpsDim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("policy beacon: head_dim %d is above the %d its farthest-point sampling "
                        "takes",
                        geometry.head_dim(), kMaxFpsDim));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PolicyState>> NewPolicyState(const PolicyConfig& config,
                                                            const PolicyGeometry& geometry,
                                                            int32_t prompt_len) {
  BKV_RETURN_IF_ERROR(ValidatePolicyGeometry(config, geometry));
  if (prompt_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt_len must be >= 0, got %d", prompt_len));
  }
  using namespace internal;  // NOLINT: factory functions
  switch (config.index()) {
    case 0:
      return NewFullState(geometry, prompt_len);
    case 1:
      return NewStreamingState(std::get<StreamingConfig>(config), geometry, prompt_len);
    case 2:
      return NewH2OState(std::get<H2OConfig>(config), geometry, prompt_len);
    case 3:
      return NewTovaState(std::get<TovaConfig>(config), geometry, prompt_len);
    case 4:
      return NewSnapKvState(std::get<SnapKvConfig>(config), geometry, prompt_len);
    case 5:
      return NewRkvState(std::get<RkvConfig>(config), geometry, prompt_len);
    case 6:
      return NewRpcState(std::get<RpcConfig>(config), geometry, prompt_len);
    case 7:
      return NewBeaconState(std::get<BeaconConfig>(config), geometry, prompt_len);
  }
  return absl::InternalError("unhandled policy config");
}

absl::StatusOr<std::vector<int32_t>> RunPolicyOnHead(const PolicyConfig& config,
                                                     const RopeConfig& rope,
                                                     const OneHeadInput& input) {
  PolicyGeometry geometry;
  geometry.group_size = input.group_size;
  geometry.rope = rope;
  BKV_ASSIGN_OR_RETURN(std::unique_ptr<PolicyState> owned,
                       NewPolicyState(config, geometry, input.prompt_len));
  PolicyState& state = *owned;
  if (input.num_steps < 0 || (input.num_steps > 0 && (!input.queries_pre || !input.queries_post ||
                                                      !input.query_positions))) {
    return absl::InvalidArgumentError("RunPolicyOnHead: query history arrays are missing");
  }
  const size_t row = static_cast<size_t>(input.group_size) * rope.head_dim;
  for (int32_t s = 0; s < input.num_steps; ++s) {
    StepQueries step{input.query_positions[s], input.queries_pre + s * row,
                     input.queries_post + s * row};
    BKV_RETURN_IF_ERROR(state.Observe(0, 0, step, &input.keys));
  }
  int32_t current = input.current_position;
  if (current < 0) {
    for (int32_t i = 0; i < input.keys.num_tokens; ++i) {
      current = std::max(current, input.keys.positions[i]);
    }
    current = std::max(current, 0);
  }
  const int32_t due[1] = {0};
  BKV_ASSIGN_OR_RETURN(std::vector<KeepSet> keep,
                       state.Compress(0, absl::MakeConstSpan(&input.keys, 1), due, current));
  BKV_CHECK(keep.size() == 1);
  return std::move(keep[0].slots);
}

namespace internal {

void QueryRing::Push(const float* row) {
  if (capacity_ == 0) return;
  auto push = [&](auto& data, auto&& write) {
    if (size_ < capacity_) {  // filling: rows go in order (next_ == size_), the storage grows
      GrowCapped(&data, static_cast<size_t>(row_floats_),
                 static_cast<size_t>(capacity_) * row_floats_);
      data.resize(data.size() + row_floats_);
      write(data.data() + static_cast<size_t>(size_) * row_floats_);
      ++size_;
      next_ = size_ % capacity_;
      return;
    }
    write(data.data() + static_cast<size_t>(next_) * row_floats_);
    next_ = (next_ + 1) % capacity_;
  };
  if (bf16_) {
    push(data16_, [&](uint16_t* to) {
      stream_ ? StreamBf16Bits(row, row_floats_, to) : RoundToBf16Bits(row, row_floats_, to);
    });
  } else {
    push(data_, [&](float* to) {
      stream_ ? StreamRow(row, row_floats_, to)
              : static_cast<void>(std::copy_n(row, row_floats_, to));
    });
  }
}

void QueryRing::CopyOrdered(float* out) const {
  const int32_t first = (next_ - size_ + capacity_) % std::max(capacity_, 1);
  for (int32_t i = 0; i < size_; ++i) {
    const size_t from = static_cast<size_t>((first + i) % capacity_) * row_floats_;
    float* to = out + static_cast<size_t>(i) * row_floats_;
    if (bf16_) {
      FromBf16Row(data16_.data() + from, row_floats_, to);
    } else {
      std::copy_n(data_.data() + from, row_floats_, to);
    }
  }
}

std::vector<int32_t> DueUniform(absl::Span<const int32_t> head_tokens, int64_t threshold) {
  std::vector<int32_t> due;
  for (size_t h = 0; h < head_tokens.size(); ++h) {
    if (head_tokens[h] >= threshold) due.push_back(static_cast<int32_t>(h));
  }
  return due;
}

std::vector<int32_t> DuePooled(absl::Span<const int32_t> head_tokens, int64_t threshold) {
  int64_t total = 0;
  for (int32_t t : head_tokens) total += t;
  std::vector<int32_t> due;
  if (total >= threshold * static_cast<int64_t>(head_tokens.size())) {
    for (size_t h = 0; h < head_tokens.size(); ++h) due.push_back(static_cast<int32_t>(h));
  }
  return due;
}

std::vector<int32_t> DueOverBudget(BudgetMode mode, absl::Span<const int32_t> head_tokens,
                                   int32_t budget, int32_t interval) {
  const int64_t threshold = int64_t{budget} + interval;
  return mode == BudgetMode::kUniform ? DueUniform(head_tokens, threshold)
                                      : DuePooled(head_tokens, threshold);
}

KeepSet ToKeepSet(int32_t layer, int32_t kv_head, const OrderedHead& ordered,
                  absl::Span<const int32_t> indexes) {
  KeepSet keep{layer, kv_head, {}};
  keep.slots.reserve(indexes.size());
  // Slots are [0, n): count them, then read them out in order (no sort). A slot named twice
  // stays twice, for the block manager to reject as before.
  std::vector<int32_t> times(ordered.size(), 0);
  for (int32_t i : indexes) {
    BKV_CHECK(i >= 0 && i < ordered.size());
    ++times[ordered.slot(i)];
  }
  for (int32_t slot = 0; slot < ordered.size(); ++slot) {
    for (int32_t t = 0; t < times[slot]; ++t) keep.slots.push_back(slot);
  }
  return keep;
}

std::vector<KeepSet> SelectScoredHeads(int32_t layer, std::vector<ScoredHead>& heads,
                                       BudgetMode mode, int64_t budget) {
  std::vector<HeadCandidates> cands;
  cands.reserve(heads.size());
  for (ScoredHead& h : heads) {
    const int32_t n = h.ordered->size();
    h.protect.resize(n, 0);
    h.scores.resize(n, 0.0f);
    cands.push_back({absl::MakeConstSpan(h.ordered->positions(), n), h.protect, h.scores});
  }
  std::vector<KeepSet> out;
  out.reserve(heads.size());
  if (mode == BudgetMode::kUniform) {
    for (size_t i = 0; i < heads.size(); ++i) {
      const std::vector<int32_t> idx = SelectUniform(cands[i], budget);
      out.push_back(ToKeepSet(layer, heads[i].kv_head, *heads[i].ordered, idx));
    }
  } else {
    const std::vector<std::vector<int32_t>> idx =
        SelectPooled(cands, budget * static_cast<int64_t>(heads.size()));
    for (size_t i = 0; i < heads.size(); ++i) {
      out.push_back(ToKeepSet(layer, heads[i].kv_head, *heads[i].ordered, idx[i]));
    }
  }
  return out;
}

int32_t CountPrompt(const OrderedHead& ordered, int32_t prompt_len) {
  const int32_t* p = ordered.positions();
  return static_cast<int32_t>(std::lower_bound(p, p + ordered.size(), prompt_len) - p);
}

}  // namespace internal
}  // namespace beaconkv
