// snapkv (decode-time variant) and rkv: a window of the newest post-RoPE queries scores the
// keys outside the window; the window's tokens are always kept.
#include <memory>

#include "core/policy_internal.h"
#include "core/redundancy.h"
#include "core/status_macros.h"

namespace beaconkv::internal {
namespace {

struct WindowedParams {
  int32_t budget;
  int32_t window;
  int32_t pool_kernel;
  Pooling pooling;
  int32_t interval;
  BudgetMode budget_mode;
  bool redundancy;  // rkv
  float lambda;
  float threshold;
};

class WindowedState final : public PolicyState {
 public:
  WindowedState(std::string_view name, const WindowedParams& p, const PolicyGeometry& g,
                int32_t prompt_len)
      : PolicyState(g, prompt_len), name_(name), p_(p) {
    rings_.assign(g.num_heads_total(), QueryRing(p.window, g.group_size * g.head_dim()));
  }

  std::string_view policy_name() const override { return name_; }

  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries& step,
                       const HeadKeys*) override {
    BKV_RETURN_IF_ERROR(CheckStep(layer, kv_head, step));
    rings_[geometry_.HeadIndex(layer, kv_head)].Push(step.post_rope);
    return absl::OkStatus();
  }

  std::vector<int32_t> DueHeads(int32_t, absl::Span<const int32_t> tokens) const override {
    return DueOverBudget(p_.budget_mode, tokens, p_.budget, p_.interval);
  }

  // The newest `window` tokens are protected; the window's queries score the others.
  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due, int32_t) override {
    const int32_t d = geometry_.head_dim();
    const int32_t g = geometry_.group_size;
    return CompressScored(
        layer, heads, due,
        {p_.budget_mode, p_.budget,
         [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
           ProtectWindow(ordered, protect);
         },
         [&](int32_t h, const OrderedHead& ordered, absl::Span<uint8_t>, absl::Span<float> scores) {
           const int32_t region = std::max(ordered.size() - p_.window, 0);
           ScoreHead(geometry_.HeadIndex(layer, h), ordered, region, d, g, scores.data());
         }});
  }

  // snapkv and rkv with uniform budgets, for an external scorer: the window's queries (max of
  // the group's logits, one softmax, mean over the queries) score the keys before the window,
  // which is kept and takes no part (protected_unscored); rkv's plan asks for its redundancy
  // term too. Pooled budgets run Compress.
  absl::StatusOr<ScoringPlan> PlanScoring(int32_t layer, absl::Span<const HeadKeys> heads,
                                          absl::Span<const int32_t> due,
                                          int32_t current_position) override {
    if (p_.budget_mode != BudgetMode::kUniform) {
      return PolicyState::PlanScoring(layer, heads, due, current_position);
    }
    ScoringPlan shape;
    shape.group_size = geometry_.group_size;
    shape.spec = {GqaReduction::kMaxLogits, QueryReduction::kMean};
    shape.pooling = p_.pooling;
    shape.pool_kernel = p_.pool_kernel;
    shape.protected_unscored = true;
    shape.redundancy = p_.redundancy;
    shape.lambda = p_.lambda;
    shape.redundancy_threshold = p_.threshold;
    return PlanScored(
        layer, heads, due,
        {p_.budget, std::move(shape),
         [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
           ProtectWindow(ordered, protect);
         },
         [&](int32_t h, const OrderedHead&, std::vector<uint8_t>*, ScoringTask* task) {
           return rings_[geometry_.HeadIndex(layer, h)].CopyOrdered(&task->queries);
         }});
  }

  int64_t StateBytes() const override {
    int64_t b = 0;
    for (const QueryRing& r : rings_) b += r.Bytes();
    return b;
  }

 private:
  void ProtectWindow(const OrderedHead& ordered, std::vector<uint8_t>* protect) const {
    const int32_t n = ordered.size();
    protect->assign(n, 0);
    for (int32_t i = std::max(n - p_.window, 0); i < n; ++i) (*protect)[i] = 1;
  }

  // scores[0, region) = importance (and, for rkv, minus redundancy) of the non-window keys.
  void ScoreHead(int32_t head_index, const OrderedHead& ordered, int32_t region, int32_t d,
                 int32_t g, float* scores) {
    if (region <= 0) return;
    const QueryRing& ring = rings_[head_index];
    queries_.resize(static_cast<size_t>(std::max(ring.size(), 1)) * g * d);
    ring.CopyOrdered(queries_.data());
    AttentionScores(ordered.keys(), 0, region, d, queries_.data(), ring.size(), g,
                    {GqaReduction::kMaxLogits, QueryReduction::kMean}, scores, &scratch_);
    Pool1d(p_.pooling, p_.pool_kernel, absl::MakeSpan(scores, region));
    if (!p_.redundancy) return;
    const int32_t n = ordered.size();
    redundancy_.resize(n);
    RedundancyScores(ordered.keys(), n, d, p_.threshold, redundancy_.data());
    for (int32_t i = 0; i < region; ++i) {
      scores[i] = p_.lambda * scores[i] - (1.0f - p_.lambda) * redundancy_[i];
    }
  }

  std::string_view name_;
  WindowedParams p_;
  std::vector<QueryRing> rings_;   // [num_heads_total], newest `window` post-RoPE steps
  std::vector<float> queries_;     // [window, group_size, head_dim] scratch
  std::vector<float> redundancy_;  // [num_tokens] scratch
  ScoreScratch scratch_;
};

}  // namespace

std::unique_ptr<PolicyState> NewSnapKvState(const SnapKvConfig& c, const PolicyGeometry& g,
                                            int32_t prompt_len) {
  return std::make_unique<WindowedState>(
      "snapkv",
      WindowedParams{c.budget, c.window, c.pool_kernel, c.pooling, c.interval, c.budget_mode, false,
                     1.0f, 0.0f},
      g, prompt_len);
}

std::unique_ptr<PolicyState> NewRkvState(const RkvConfig& c, const PolicyGeometry& g,
                                         int32_t prompt_len) {
  return std::make_unique<WindowedState>(
      "rkv",
      WindowedParams{c.budget, c.window, c.pool_kernel, Pooling::kMax, c.interval,
                     BudgetMode::kUniform, true, static_cast<float>(c.lambda),
                     static_cast<float>(c.redundancy_threshold)},
      g, prompt_len);
}

}  // namespace beaconkv::internal
