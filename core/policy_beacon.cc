// beacon: BeaconKV (DESIGN.md §3). Observation set = the newest n_recent post-RoPE queries of
// every query head of the group + n_beacons beacons (FPS over the pre-RoPE query buffer,
// rotated to the current position); score = max over all of them of the softmax attention.
// The first coverage_layers layers keep an evenly spaced sample first, then the best scores;
// with redundancy > 0 the other layers subtract R-KV's redundancy from the scores.
#include <algorithm>
#include <memory>

#include "absl/strings/str_format.h"
#include "core/beacon_bank.h"
#include "core/check.h"
#include "core/policy_internal.h"
#include "core/redundancy.h"
#include "core/selection.h"
#include "core/status_macros.h"

namespace beaconkv::internal {
namespace {

// A head's scoring scratch, per thread rather than per sequence: different layers of one
// sequence may be compressed at once (LayersConcurrent), and one copy serves every sequence.
struct BeaconScratch {
  std::vector<float> beacons;           // [n_beacons, head_dim]
  std::vector<float> queries;           // [rows, head_dim]
  std::vector<float> redundancy;        // [num_tokens]
  std::vector<uint8_t> outside_prompt;  // ReservePrompt's
  ScoreScratch score;
};
BeaconScratch& Scratch() {
  static thread_local BeaconScratch scratch;
  return scratch;
}

class BeaconState final : public PolicyState {
 public:
  BeaconState(const BeaconConfig& c, const PolicyGeometry& g, int32_t prompt_len, Rope rope)
      : PolicyState(g, prompt_len), config_(c), rope_(std::move(rope)) {
    // The pairs a blurred row zeroes: those turning faster than blur_speed (the first ones).
    if (c.blur_speed > 0.0) {
      for (const float w : rope_.inv_freq()) blur_pairs_ += static_cast<double>(w) > c.blur_speed;
    }
    blurs_layer_.assign(g.num_layers, c.blur_layers.empty() && blur_pairs_ > 0);
    for (const int32_t l : c.blur_layers) blurs_layer_[l] = blur_pairs_ > 0;
    // With bfloat16 scores the recent queries are kept in bfloat16 (the scores round them
    // anyway, so they score the same) and so are the buffered ones: half the memory.
    rings_.assign(g.num_heads_total(),
                  QueryRing(c.n_recent, g.group_size * g.head_dim(), /*bf16=*/c.score_bf16,
                            /*stream=*/true));
    banks_.reserve(g.num_heads_total());
    for (int32_t i = 0; i < g.num_heads_total(); ++i) {
      banks_.emplace_back(g.head_dim(), c.buffer_min, c.buffer_max, c.draw_on_fill, c.beacon_radius,
                          /*bf16=*/c.score_bf16);
    }
  }

  std::string_view policy_name() const override { return "beacon"; }
  // Each head's rings and bank are its own and the scoring scratch is per thread.
  bool LayersConcurrent() const override { return true; }
  // Uniform budgets select each head on its own; pooled ones share the layer's budget.
  bool HeadsConcurrent() const override { return config_.budget_mode == BudgetMode::kUniform; }
  // Each head's ring and bank are its own.
  bool ObserveConcurrent() const override { return true; }

  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries& step,
                       const HeadKeys*) override {
    if (absl::Status s = CheckStep(layer, kv_head, step); !s.ok()) return s;
    const int32_t index = geometry_.HeadIndex(layer, kv_head);
    rings_[index].Push(step.post_rope);
    for (int32_t h = 0; h < geometry_.group_size; ++h) {
      banks_[index].Append(step.pre_rope + static_cast<size_t>(h) * geometry_.head_dim());
    }
    // The rings' and banks' rows go out with non-temporal stores (no read of a line that is
    // read back only at the next compression): a step's last head fences them, so that a
    // compression on another thread reads them, when the heads are observed in turn on one
    // thread. Observed inside the attention's region (ObserveConcurrent), each of its threads
    // fences its own stores before the region ends (PagedDecodeAttentionCpu).
    if (index == geometry_.num_heads_total() - 1) StreamFence();
    return absl::OkStatus();
  }

  std::vector<int32_t> DueHeads(int32_t layer, absl::Span<const int32_t> tokens) const override {
    return DueOverBudget(config_.budget_mode, tokens, Budget(layer), config_.interval);
  }

  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due,
                                                int32_t current_position) override {
    return CompressScored(layer, heads, due,
                          {config_.budget_mode, Budget(layer),
                           [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
                             *protect = ProtectMask(layer, ordered);
                           },
                           [&](int32_t h, const OrderedHead& ordered, absl::Span<uint8_t> protect,
                               absl::Span<float> scores) {
                             ScoreHead(geometry_.HeadIndex(layer, h), ordered, current_position,
                                       scores.data());
                             FinishScores(layer, ordered, protect, scores);
                           }});
  }

  absl::StatusOr<std::vector<KeepSet>> SelectFromScores(
      const ScoringPlan& plan, absl::Span<const HeadKeys> heads,
      absl::Span<const absl::Span<const float>> scores) override {
    const int32_t layer = plan.layer;
    BKV_RETURN_IF_ERROR(CheckHead(layer, 0));
    if (!plan.pooled || config_.budget_mode != BudgetMode::kPooled) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "policy beacon: layer %d: scores are selected here only for a pooled plan of a pooled "
          "policy; uniform plans keep the scorer's masks",
          layer));
    }
    if (plan.tasks.size() != static_cast<size_t>(geometry_.num_kv_heads) ||
        scores.size() != plan.tasks.size() || heads.size() != plan.tasks.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "policy beacon: pooled plan of layer %d: %d tasks, %d score arrays and %d heads for "
          "%d kv heads",
          layer, plan.tasks.size(), scores.size(), heads.size(), geometry_.num_kv_heads));
    }
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const ScoringTask& task = plan.tasks[t];
      if (task.kv_head != static_cast<int32_t>(t) ||
          static_cast<int64_t>(scores[t].size()) != task.num_tokens() ||
          heads[t].num_tokens != task.num_tokens()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "policy beacon: pooled plan of layer %d, task %d (kv_head %d): %d scores and %d "
            "tokens for %d planned",
            layer, t, task.kv_head, scores[t].size(), heads[t].num_tokens, task.num_tokens()));
      }
    }
    const std::vector<int32_t> all;  // pooled: CompressScored takes every head
    return CompressScored(layer, heads, all,
                          {BudgetMode::kPooled, Budget(layer),
                           [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
                             *protect = ProtectMask(layer, ordered);
                           },
                           [&](int32_t h, const OrderedHead& ordered, absl::Span<uint8_t> protect,
                               absl::Span<float> out) {
                             // The scorer's slot order into position order, then what Compress does
                             // after its own scoring.
                             for (int32_t i = 0; i < ordered.size(); ++i)
                               out[i] = scores[h][ordered.slot(i)];
                             FinishScores(layer, ordered, protect, out);
                           }},
                          /*need_keys=*/false);
  }

  absl::StatusOr<ScoringPlan> PlanScoring(int32_t layer, absl::Span<const HeadKeys> heads,
                                          absl::Span<const int32_t> due,
                                          int32_t current_position) override {
    // (Pooled budgets exclude the redundancy term, which needs the keys: NewPolicyState.)
    const bool pooled = config_.budget_mode == BudgetMode::kPooled;
    ScoringPlan shape;
    shape.group_size = 1;
    shape.spec = Spec();
    shape.pooling = Pooling::kMax;
    shape.pool_kernel = config_.pool_kernel;
    shape.rope_theta = geometry_.rope.rope_theta;
    absl::StatusOr<ScoringPlan> plan = PlanScored(
        layer, heads, due,
        {Budget(layer), std::move(shape),
         [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
           *protect = ProtectMask(layer, ordered);
         },
         [&](int32_t h, const OrderedHead& ordered, std::vector<uint8_t>* protect,
             ScoringTask* task) {
           // The beacons go out before RoPE, for the scorer to rotate.
           const int32_t rows = BuildRows(geometry_.HeadIndex(layer, h), current_position,
                                          /*rotate=*/false, &task->rotated_rows);
           task->rotate_to = current_position;
           const std::vector<float>& queries = Scratch().queries;
           task->queries.assign(queries.begin(), queries.begin() + static_cast<ptrdiff_t>(rows) *
                                                                       geometry_.head_dim());
           // Pooled, the coverage sample and the prompt slots act on the scores when they
           // come back (SelectFromScores), as in Compress.
           if (pooled) return rows;
           // Compress adds 2 to the sample's scores after pooling, which puts all of it above
           // every scored token: the same set as keeping it outright beside the protected ones.
           if (IsCoverage(layer)) {
             for (int32_t i : CoverageFor(layer, ordered, *protect)) (*protect)[i] = 1;
           } else if (const int32_t slots = PromptSlots(); slots > 0) {
             // ReservePrompt's picks, as a region the scorer serves first.
             OutsidePrompt(ordered, *protect, &task->reserve);
             for (uint8_t& r : task->reserve) r = !r;
             task->reserve_k = slots;
           }
           return rows;
         },
         config_.budget_mode});
    if (!plan.ok() || !Penalised(layer) || plan->tasks.empty()) return plan;
    // The penalty's lambda depends on the head's length, and a plan has one: heads of
    // different lengths (which uniform budgets do not produce) go through Compress.
    const int64_t n = plan->tasks.front().num_tokens();
    for (const ScoringTask& task : plan->tasks) {
      if (task.num_tokens() != n) {
        return absl::UnimplementedError(
            "policy beacon: redundancy over heads of different lengths; run Compress");
      }
    }
    plan->redundancy = true;
    plan->lambda = PenaltyLambda(n);
    plan->redundancy_threshold = static_cast<float>(config_.redundancy_threshold);
    return plan;
  }

  int64_t StateBytes() const override {
    int64_t b = 0;
    for (const QueryRing& r : rings_) b += r.Bytes();
    for (const BeaconBank& k : banks_) b += k.CapacityBytes();
    return b;
  }

 private:
  int64_t Budget(int32_t layer) const { return LayerBudget(config_, layer); }
  bool IsCoverage(int32_t layer) const { return layer < config_.coverage_layers; }
  bool Penalised(int32_t layer) const { return config_.redundancy > 0 && !IsCoverage(layer); }

  // score - w n r = (lambda score - (1 - lambda) r) / lambda with lambda = 1 / (1 + w n): the
  // scorers' penalised rank (kernels PenalisedScore), the same order.
  float PenaltyLambda(int64_t n) const {
    return 1.0f / (1.0f + static_cast<float>(config_.redundancy) * static_cast<float>(n));
  }

  // scores <- lambda x scores - (1 - lambda) x redundancy, as the scorers rank.
  void Penalise(const OrderedHead& ordered, absl::Span<float> scores) {
    const int32_t n = ordered.size();
    std::vector<float>& redundancy = Scratch().redundancy;
    redundancy.resize(n);
    RedundancyScores(ordered.keys(), n, geometry_.head_dim(),
                     static_cast<float>(config_.redundancy_threshold), redundancy.data());
    const float lambda = PenaltyLambda(n);
    for (int32_t i = 0; i < n; ++i)
      scores[i] = lambda * scores[i] - (1.0f - lambda) * redundancy[i];
  }

  // Marks the head's PromptSlots() best-scored unprotected prompt tokens kept (ties to the
  // newer, as in the selection): the selection keeps them besides the protected ones, out of
  // the head's budget (uniform) or the layer's (pooled).
  void ReservePrompt(const OrderedHead& ordered, absl::Span<uint8_t> protect,
                     absl::Span<const float> scores) {
    const int32_t slots = PromptSlots();
    if (slots <= 0) return;
    std::vector<uint8_t>& outside = Scratch().outside_prompt;
    OutsidePrompt(ordered, protect, &outside);
    const HeadCandidates region{absl::MakeConstSpan(ordered.positions(), ordered.size()), outside,
                                scores};
    for (int32_t i : TopKUnprotected(region, slots)) protect[i] = 1;
  }

  // [n] position order: 1 for the tokens the prompt slots cannot take (the protected ones and
  // every token after the prompt), 0 for the unprotected prompt tokens.
  void OutsidePrompt(const OrderedHead& ordered, absl::Span<const uint8_t> protect,
                     std::vector<uint8_t>* out) const {
    out->assign(protect.begin(), protect.end());
    std::fill(out->begin() + CountPrompt(ordered, prompt_len_), out->end(), uint8_t{1});
  }

  // The prompt slots a head takes (at most one in eight of the free ones, so that small
  // budgets keep theirs for the scores; docs/policies.md, "Prompt slots").
  int32_t PromptSlots() const { return PromptSlotsInEffect(config_); }

  // Prompt (when it fits beside the recent window) or else the first n_sinks tokens, plus
  // the newest n_recent tokens.
  std::vector<uint8_t> ProtectMask(int32_t layer, const OrderedHead& ordered) const {
    const int32_t n = ordered.size();
    std::vector<uint8_t> protect(n, 0);
    const int32_t prompt = CountPrompt(ordered, prompt_len_);
    const bool keep_prompt =
        config_.protect_prompt && int64_t{prompt} + config_.n_recent <= Budget(layer);
    const int32_t head = keep_prompt ? prompt : std::min(config_.n_sinks, n);
    for (int32_t i = 0; i < head; ++i) protect[i] = 1;
    for (int32_t i = std::max(n - config_.n_recent, 0); i < n; ++i) protect[i] = 1;
    return protect;
  }

  // The coverage layers' evenly spaced sample of the unprotected tokens, sized to the budget
  // the protected ones leave.
  std::vector<int32_t> CoverageFor(int32_t layer, const OrderedHead& ordered,
                                   absl::Span<const uint8_t> protect) const {
    const int64_t free = Budget(layer) - std::count(protect.begin(), protect.end(), 1);
    return CoverageUnprotected(absl::MakeConstSpan(ordered.positions(), ordered.size()), protect,
                               free);
  }

  // The head's scores before pooling (max over the observation rows of the softmax), [n]
  // position order; draws the beacons.
  void ScoreHead(int32_t head_index, const OrderedHead& ordered, int32_t current_position,
                 float* scores) {
    const int32_t d = geometry_.head_dim();
    const int32_t rows = BuildRows(head_index, current_position);
    BeaconScratch& scratch = Scratch();
    AttentionScores(ordered.keys(), 0, ordered.size(), d, scratch.queries.data(), rows, 1, Spec(),
                    scores, &scratch.score);
  }

  // Max over the rows of their softmax, in bfloat16 products when the config says so.
  ScoreSpec Spec() const {
    return {GqaReduction::kMaxProbs, QueryReduction::kMax, config_.score_bf16};
  }

  // What follows the scoring, in Compress and in SelectFromScores: pooling, the redundancy
  // term, then the prompt slots or (coverage layers) the evenly spaced sample.
  void FinishScores(int32_t layer, const OrderedHead& ordered, absl::Span<uint8_t> protect,
                    absl::Span<float> scores) {
    Pool1d(Pooling::kMax, config_.pool_kernel, scores);
    if (Penalised(layer)) Penalise(ordered, scores);
    if (!IsCoverage(layer)) {
      ReservePrompt(ordered, protect, scores);
      return;
    }
    // The evenly spaced sample is kept first (scores are probabilities <= 1, so +2 puts it
    // above every other token); the slots its empty strata leave go by score.
    for (int32_t i : CoverageFor(layer, ordered, protect)) scores[i] += 2.0f;
  }

  // Fills this thread's Scratch().queries with the head's observation rows (every recent post-RoPE
  // query of every query head, then the beacons rotated to current_position, or left before RoPE
  // when !rotate, then the blurred rows of the leading beacons); returns their number, and the
  // beacon and blurred rows' in *beacon_rows when given (rotating a blurred row before or
  // after zeroing its fast pairs is the same: RoPE turns each pair on its own).
  int32_t BuildRows(int32_t head_index, int32_t current_position, bool rotate = true,
                    int32_t* beacon_rows = nullptr) {
    const int32_t d = geometry_.head_dim();
    const int32_t g = geometry_.group_size;
    std::vector<float>& queries = Scratch().queries;
    std::vector<float>& drawn = Scratch().beacons;
    const QueryRing& ring = rings_[head_index];
    const int32_t recent_rows = ring.size() * g;
    BeaconBank& bank = banks_[head_index];
    const int32_t beacons = rotate
                                ? bank.Beacons(config_.n_beacons, rope_, current_position, &drawn)
                                : bank.Beacons(config_.n_beacons, &drawn);
    const bool blurs = blurs_layer_[head_index / geometry_.num_kv_heads];
    const int32_t blurred = blurs ? std::min(beacons, config_.blurred_beacons) : 0;
    if (beacon_rows != nullptr) *beacon_rows = beacons + blurred;
    // Every recent query of every query head, and every beacon, is one observation row;
    // max over rows == max over queries and over the group.
    queries.resize(static_cast<size_t>(recent_rows + beacons + blurred) * d);
    ring.CopyOrdered(queries.data());
    std::copy(drawn.begin(), drawn.end(),
              queries.begin() + static_cast<ptrdiff_t>(recent_rows) * d);
    // Blurred rows: pair i of a RoPE'd vector is (i, i + d / 2), turning faster the smaller i.
    const int32_t half = d / 2;
    for (int32_t b = 0; b < blurred; ++b) {
      float* row = queries.data() + static_cast<size_t>(recent_rows + beacons + b) * d;
      std::copy_n(drawn.data() + static_cast<size_t>(b) * d, d, row);
      std::fill_n(row, blur_pairs_, 0.0f);
      std::fill_n(row + half, blur_pairs_, 0.0f);
    }
    return recent_rows + beacons + blurred;
  }

  BeaconConfig config_;
  Rope rope_;
  int32_t blur_pairs_ = 0;         // leading RoPE pairs zeroed in a blurred beacon row
  std::vector<bool> blurs_layer_;  // [num_layers]: the layer's heads score blurred rows
  std::vector<QueryRing> rings_;   // [num_heads_total], newest n_recent post-RoPE steps
  std::vector<BeaconBank> banks_;  // [num_heads_total], pre-RoPE query buffers
};

}  // namespace

std::unique_ptr<PolicyState> NewBeaconState(const BeaconConfig& c, const PolicyGeometry& g,
                                            int32_t prompt_len) {
  absl::StatusOr<Rope> rope = Rope::Create(g.rope);
  BKV_CHECK(rope.ok());  // validated by NewPolicyState
  return std::make_unique<BeaconState>(c, g, prompt_len, *std::move(rope));
}

}  // namespace beaconkv::internal
