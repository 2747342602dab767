#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "engine/compress_step.h"
#include "engine/engine_config.h"
#include "engine/tokenizer.h"

namespace beaconkv {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds the time from construction to destruction to `*acc`.
class ScopedTimer {
 public:
  explicit ScopedTimer(double* acc) : acc_(acc), start_(Now()) {}
  ~ScopedTimer() { *acc_ += Now() - start_; }

 private:
  double* acc_;
  double start_;
};

// What a policy knows of the model.
PolicyGeometry PolicyGeometryOf(const ModelRunner& runner) {
  PolicyGeometry geo;
  geo.num_layers = runner.config().num_layers;
  geo.num_kv_heads = runner.config().num_kv_heads;
  geo.group_size = runner.group_size();
  geo.rope = runner.rope().config();
  return geo;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::FromModelDir(const std::string& model_dir,
                                                             const EngineConfig& config) {
  BKV_ASSIGN_OR_RETURN(
      ModelWeights weights,
      LoadModelWeights(model_dir, {.allow_nonfinite = config.allow_nonfinite_weights}));
  EngineConfig c = config;
  if (c.eos_token_id < 0) {
    BKV_ASSIGN_OR_RETURN(CharTokenizer tok, CharTokenizer::Load(model_dir));
    // Ids the tokenizer makes must be rows of the embedding, and ids the model samples must
    // decode: a tokenizer.json that disagrees with config.json is refused here, once.
    if (tok.vocab_size() != weights.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tokenizer.json has %d tokens but config.json field 'vocab_size' is %d; the "
          "tokenizer does not belong to this model",
          model_dir, tok.vocab_size(), weights.config.vocab_size));
    }
    c.eos_token_id = tok.eos_id();
  }
  return Create(std::move(weights), c);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(ModelWeights weights,
                                                       const EngineConfig& config_in) {
  EngineConfig config = config_in;
  BKV_RETURN_IF_ERROR(ResolveEngineConfig(weights.config, &config));
  BKV_ASSIGN_OR_RETURN(
      ModelRunner runner,
      ModelRunner::Create(std::move(weights), config.num_threads, config.batch_invariant));
  const ModelConfig& mc = runner.config();
  // The default policy against the model now, not at the first request.
  BKV_RETURN_IF_ERROR(ValidatePolicyGeometry(config.policy, PolicyGeometryOf(runner)));
  BlockManagerConfig bc;
  bc.shape = {mc.num_layers, mc.num_kv_heads, mc.head_dim, config.block_size};
  bc.num_blocks = config.num_blocks;
  bc.num_host_blocks = config.num_host_blocks;
  auto store = std::make_unique<CpuKvStore>(bc.num_blocks, bc.shape.block_size, mc.head_dim);
  BKV_ASSIGN_OR_RETURN(std::unique_ptr<BlockManager> bm, BlockManager::Create(bc, store.get()));
  return std::unique_ptr<Engine>(
      new Engine(config, std::move(runner), std::move(store), std::move(bm)));
}

Engine::Engine(const EngineConfig& config, ModelRunner runner, std::unique_ptr<CpuKvStore> store,
               std::unique_ptr<BlockManager> bm)
    : config_(config), runner_(std::move(runner)), store_(std::move(store)), bm_(std::move(bm)) {
  if (config_.scorer == ScorerKind::kPaged)
    scorer_ = std::make_unique<PagedTwinScorer>(store_.get());
}

int32_t Engine::PromptBlocks(int64_t tokens) const {
  return bm_->shape().num_heads_total() * bm_->shape().BlocksFor(tokens);
}

absl::Status Engine::AddRequest(Request request) {
  const std::lock_guard<std::mutex> lock(mu_);
  return AddRequestLocked(std::move(request), config_.policy);
}

absl::Status Engine::AddRequestLocked(Request request, const PolicyConfig& policy_config) {
  const ModelConfig& mc = runner_.config();
  if (seqs_.contains(request.id))
    return absl::InvalidArgumentError(
        absl::StrFormat("request id %d is already queued", request.id));
  if (request.prompt.empty())
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d has an empty prompt", request.id));
  for (const std::vector<int32_t>* ids : {&request.prompt, &request.forced_output}) {
    for (int32_t t : *ids) {
      if (t < 0 || t >= mc.vocab_size)
        return absl::InvalidArgumentError(
            absl::StrFormat("request %d: token id %d is outside the vocabulary [0, %d)", request.id,
                            t, mc.vocab_size));
    }
  }
  BKV_RETURN_IF_ERROR(request.sampling.Validate());
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len >= config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: prompt of %d tokens does not leave room under max_model_len %d", request.id,
        prompt_len, config_.max_model_len));
  }
  // Teacher forcing feeds every forced token: all of them must fit under max_model_len, or the
  // request would end early with fewer logits than targets.
  const int64_t forced_len = static_cast<int64_t>(request.forced_output.size());
  if (forced_len > 0 && prompt_len + forced_len > config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: prompt of %d tokens + forced output of %d tokens exceeds max_model_len %d",
        request.id, prompt_len, forced_len, config_.max_model_len));
  }
  if (PromptBlocks(prompt_len) + config_.watermark_blocks > bm_->NumUsableBlocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: prompt of %d tokens needs %d blocks (+%d watermark); the pool has %d",
        request.id, prompt_len, PromptBlocks(prompt_len), config_.watermark_blocks,
        bm_->NumUsableBlocks()));
  }
  BKV_ASSIGN_OR_RETURN(
      std::unique_ptr<PolicyState> policy,
      NewPolicyState(policy_config, PolicyGeometryOf(runner_), static_cast<int32_t>(prompt_len)));
  auto s = std::make_unique<SeqState>(SeqState{.request = request,
                                               .sampler = Sampler(request.sampling),
                                               .policy_config = policy_config,
                                               .policy = std::move(policy),
                                               .out = RequestOutput{},
                                               .evictions = {},
                                               .count_bias = {}});
  s->out.id = request.id;
  s->out.prompt_len = static_cast<int32_t>(prompt_len);
  waiting_.push_back(request.id);
  seqs_.emplace(request.id, std::move(s));
  return absl::OkStatus();
}

absl::StatusOr<EvictionRecord> Engine::ReplayEvictions(absl::Span<const int32_t> tokens,
                                                       int32_t prompt_len,
                                                       const PolicyConfig& policy) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (HasUnfinishedLocked()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReplayEvictions runs one sequence alone, but %d requests are unfinished; run them "
        "to completion first",
        waiting_.size() + running_.size() + swapped_.size()));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("ReplayEvictions: the token sequence is empty");
  if (prompt_len < 1 || prompt_len > n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReplayEvictions: prompt_len %d is outside [1, %d] (the sequence has %d tokens)",
        prompt_len, n, n));
  }
  // The last position is cached by the step that feeds the token after it: a pad that is
  // never fed, only accepted as the sequence's end.
  if (n + 1 > config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReplayEvictions: a sequence of %d tokens needs max_model_len >= %d; the engine's is %d", n,
        n + 1, config_.max_model_len));
  }
  Request r;
  r.id = 0;  // the engine is idle: no id is in use
  r.prompt.assign(tokens.begin(), tokens.begin() + prompt_len);
  r.forced_output.assign(tokens.begin() + prompt_len, tokens.end());
  r.forced_output.push_back(tokens.back());
  r.sampling.max_new_tokens = static_cast<int32_t>(r.forced_output.size());
  r.record_evictions = true;
  BKV_RETURN_IF_ERROR(AddRequestLocked(std::move(r), policy));
  std::vector<RequestOutput> finished;
  const double start = Now();
  while (HasUnfinishedLocked()) BKV_RETURN_IF_ERROR(StepLocked(&finished));
  stats_.wall_seconds += Now() - start;
  BKV_CHECK(finished.size() == 1);
  RequestOutput& out = finished.front();
  if (out.finish_reason != FinishReason::kForced) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "ReplayEvictions: the sequence of %d tokens ended with %d positions cached (%s); the "
        "pool of %d blocks cannot hold it",
        n, out.prompt_len + static_cast<int64_t>(out.output.size()) - 1,
        FinishReasonName(out.finish_reason), bm_->NumUsableBlocks()));
  }
  BKV_CHECK(out.evictions.num_positions == n);
  return std::move(out.evictions);
}

absl::StatusOr<std::vector<RequestOutput>> Engine::RunToCompletion() {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<RequestOutput> finished;
  const double start = Now();
  while (HasUnfinishedLocked()) {
    BKV_RETURN_IF_ERROR(StepLocked(&finished));
  }
  stats_.wall_seconds += Now() - start;
  return finished;
}

void Engine::Observe(SeqState& s, int32_t layer, int32_t kv_head, int32_t position,
                     const float* pre, const float* post) {
  std::vector<float> keys;
  std::vector<int32_t> positions;
  HeadKeys hk;
  if (s.policy->NeedsKeysOnObserve())
    hk = GatherHead(*bm_, *store_, s.out.id, layer, kv_head, &keys, &positions);
  absl::Status st = s.policy->Observe(layer, kv_head, StepQueries{position, pre, post},
                                      s.policy->NeedsKeysOnObserve() ? &hk : nullptr);
  // The runner's callback cannot return a status: keep the first error for the step (calls
  // may come from several threads at once: ObserveConcurrent).
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(observe_mu_);
    if (observe_status_.ok()) observe_status_ = st;
  }
}

int32_t Engine::PeakBlocks(const SeqState& s, int64_t prefill_len) const {
  // A teacher-forced request ends after its forced tokens, whatever max_new_tokens says.
  const int64_t end =
      static_cast<int64_t>(s.request.prompt.size()) +
      (s.request.forced_output.empty() ? s.request.sampling.max_new_tokens
                                       : static_cast<int64_t>(s.request.forced_output.size()));
  const std::optional<int64_t> peak =
      beaconkv::PeakBlocks(s.policy_config, bm_->shape(), static_cast<int32_t>(prefill_len), end);
  return peak ? static_cast<int32_t>(*peak) : -1;
}

int64_t Engine::DecodeStepsLeft(const SeqState& s) const {
  const int64_t prompt = static_cast<int64_t>(s.request.prompt.size());
  const int64_t outputs = s.request.forced_output.empty()
                              ? s.request.sampling.max_new_tokens
                              : static_cast<int64_t>(s.request.forced_output.size());
  const int64_t end = std::min<int64_t>(prompt + outputs, config_.max_model_len);
  return std::max<int64_t>(0, end - prompt - static_cast<int64_t>(s.out.output.size()));
}

bool Engine::ReservationFits(const SeqState& s, int64_t prefill_len) const {
  const KvShape& shape = bm_->shape();
  const std::optional<HeadTrigger> trigger = BudgetTrigger(s.policy_config);
  std::vector<int64_t> demand(BlockDemandHorizon(s.policy_config).value_or(1), 0);
  std::vector<int32_t> heads(shape.num_heads_total());
  // Now (k = 0) every running sequence is compressed after its last step; step k >= 1 is the
  // k-th next decode step's high point. The new sequence's prefill comes before step 1.
  for (int64_t id : running_) {
    const SeqState& r = *seqs_.at(id);
    if (!trigger || BudgetTrigger(r.policy_config) != trigger) {
      const int64_t c = std::max<int64_t>(BKV_CHECK_VALUE(bm_->NumBlocksOf(id)), r.peak_blocks);
      for (int64_t& d : demand) d += c;
      continue;
    }
    BKV_CHECK(bm_->RetainedTokensOfHeads(id, absl::MakeSpan(heads)).ok());
    AddBlockDemand(r.policy_config, shape, {heads, false, DecodeStepsLeft(r)},
                   absl::MakeSpan(demand));
  }
  if (trigger) {
    std::fill(heads.begin(), heads.end(), static_cast<int32_t>(prefill_len));
    AddBlockDemand(s.policy_config, shape, {heads, false, DecodeStepsLeft(s)},
                   absl::MakeSpan(demand));
  } else {
    for (int64_t& d : demand) d += PromptBlocks(prefill_len);
  }
  return *std::max_element(demand.begin(), demand.end()) + config_.watermark_blocks <=
         bm_->NumUsedBlocks() + bm_->NumFreeBlocks();
}

absl::Status Engine::Admit(SeqState& s) {
  std::vector<int32_t> tokens = s.request.prompt;
  const bool resumed = !s.out.output.empty();  // recompute after preemption
  if (resumed) tokens.insert(tokens.end(), s.out.output.begin(), s.out.output.end() - 1);
  const int64_t id = s.out.id;
  {
    ScopedTimer t(&stats_.time_bookkeeping);
    BKV_RETURN_IF_ERROR(bm_->AddSequence(id, static_cast<int32_t>(tokens.size())));
  }
  s.in_cache = true;
  std::vector<float> logits(runner_.config().vocab_size);
  QuerySink sink = [&](int32_t, int32_t layer, int32_t kv_head, int32_t position, const float* pre,
                       const float* post) { Observe(s, layer, kv_head, position, pre, post); };
  const double scoring_before = stats_.time_scoring, start = Now();
  absl::Status st =
      runner_.Prefill(id, tokens, *bm_, *store_, &sink, logits.data(), &stats_.time_scoring);
  stats_.time_prefill += Now() - start - (stats_.time_scoring - scoring_before);
  BKV_RETURN_IF_ERROR(st);
  BKV_RETURN_IF_ERROR(std::exchange(observe_status_, absl::OkStatus()));
  stats_.prefill_tokens += static_cast<int64_t>(tokens.size());
  running_.push_back(id);
  UpdatePeak(s);  // a request that finishes here still reports the KV it held
  if (!resumed) {
    if (Accept(s, logits)) return absl::OkStatus();  // finished in DecodeStep's sweep
  } else {
    s.pending = s.out.output.back();
  }
  return absl::OkStatus();
}

int32_t Engine::TokenAt(const SeqState& s, int32_t position) {
  const std::vector<int32_t>& prompt = s.request.prompt;
  return position < static_cast<int32_t>(prompt.size()) ? prompt[position]
                                                        : s.out.output[position - prompt.size()];
}

absl::Status Engine::AddCountBias(SeqState& s, int32_t position, int32_t layers, int64_t b,
                                  std::vector<absl::Span<const float>>* head_bias) {
  ScopedTimer t(&stats_.time_bookkeeping);
  const KvShape& shape = bm_->shape();
  const int64_t heads_total = shape.num_heads_total();
  if (head_bias->empty()) head_bias->resize(static_cast<int64_t>(running_.size()) * heads_total);
  auto token_at = [&s](int32_t p) { return TokenAt(s, p); };
  for (int32_t l = 0; l < layers; ++l) {
    for (int32_t g = 0; g < shape.num_kv_heads; ++g) {
      // The span stays valid through the step: each head is asked once per step.
      BKV_ASSIGN_OR_RETURN(
          (*head_bias)[b * heads_total + l * shape.num_kv_heads + g],
          s.count_bias.Head(*bm_, *store_, s.request.id, l, g, position, token_at));
    }
  }
  return absl::OkStatus();
}

bool Engine::Accept(SeqState& s, absl::Span<const float> logits) {
  const Request& r = s.request;
  const bool forced = !r.forced_output.empty();
  const int32_t token = forced ? r.forced_output[s.out.output.size()] : s.sampler.Sample(logits);
  if (r.return_logits) s.out.logits.insert(s.out.logits.end(), logits.begin(), logits.end());
  s.out.output.push_back(token);
  s.pending = token;
  ++stats_.generated_tokens;
  const size_t n = s.out.output.size();
  if (forced) {
    if (n == r.forced_output.size()) s.out.finish_reason = FinishReason::kForced;
  } else if (!r.sampling.ignore_eos && token == config_.eos_token_id) {
    s.out.finish_reason = FinishReason::kEos;
  } else if (static_cast<int32_t>(n) >= r.sampling.max_new_tokens) {
    s.out.finish_reason = FinishReason::kLength;
  }
  if (s.out.finish_reason == FinishReason::kRunning &&
      static_cast<int64_t>(r.prompt.size() + n) >= config_.max_model_len) {
    s.out.finish_reason = FinishReason::kMaxModelLen;
  }
  return s.out.finish_reason != FinishReason::kRunning;
}

void Engine::RecordEvictions(SeqState& s, const KeepSet& kept, absl::Span<const int32_t> positions,
                             int32_t step) {
  size_t k = 0;
  for (int32_t slot = 0; slot < static_cast<int32_t>(positions.size()); ++slot) {
    if (k < kept.slots.size() && kept.slots[k] == slot) {
      ++k;
      continue;
    }
    s.evictions.push_back({kept.layer, kept.kv_head, positions[slot], step});
  }
  BKV_CHECK(k == kept.slots.size());  // keep-sets are ascending slots of the head
}

EvictionRecord Engine::BuildEvictionRecord(const SeqState& s) const {
  const KvShape& shape = bm_->shape();
  EvictionRecord rec;
  rec.num_layers = shape.num_layers;
  rec.num_kv_heads = shape.num_kv_heads;
  rec.num_positions =
      s.out.prompt_len + std::max<int32_t>(static_cast<int32_t>(s.out.output.size()), 1) - 1;
  rec.evicted_at.assign(static_cast<size_t>(rec.num_layers) * rec.num_kv_heads * rec.num_positions,
                        kNeverEvicted);
  for (const EvictionEvent& e : s.evictions) {
    BKV_CHECK(e.position >= 0 && e.position < rec.num_positions);
    int64_t& at = rec.evicted_at[(static_cast<size_t>(e.layer) * rec.num_kv_heads + e.kv_head) *
                                     rec.num_positions +
                                 e.position];
    BKV_CHECK(at == kNeverEvicted);  // eviction is irreversible
    at = e.step;
    rec.first_step = std::min<int64_t>(rec.first_step, e.step);
  }
  return rec;
}

void Engine::Finish(int64_t id, std::vector<RequestOutput>* finished) {
  SeqState& s = *seqs_.at(id);
  if (s.request.record_evictions) s.out.evictions = BuildEvictionRecord(s);
  if (s.in_cache) BKV_CHECK(bm_->FreeSequence(id).ok());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  finished->push_back(std::move(s.out));
  seqs_.erase(id);
}

absl::Status Engine::Preempt(int64_t id) {
  SeqState& s = *seqs_.at(id);
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  ++s.out.num_preemptions;
  if (config_.preemption == PreemptionMode::kSwap &&
      BKV_CHECK_VALUE(bm_->NumBlocksOf(id)) <= bm_->NumFreeHostBlocks()) {
    BKV_RETURN_IF_ERROR(bm_->SwapOut(id));
    swapped_.push_back(id);
    ++stats_.preemptions_swap;
    return absl::OkStatus();
  }
  // Recompute: drop the cache and the policy's memory; the text is re-prefilled later.
  BKV_RETURN_IF_ERROR(bm_->FreeSequence(id));
  s.in_cache = false;
  BKV_ASSIGN_OR_RETURN(
      std::unique_ptr<PolicyState> fresh,
      NewPolicyState(s.policy_config, s.policy->geometry(), s.policy->prompt_len()));
  s.policy = std::move(fresh);
  s.evictions.clear();  // the re-prefill caches every position again
  waiting_.push_front(id);
  ++stats_.preemptions_recompute;
  return absl::OkStatus();
}

bool Engine::HasUnfinished() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return HasUnfinishedLocked();
}

EngineStats Engine::stats() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int32_t Engine::num_running() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(running_.size());
}

absl::Status Engine::Step(std::vector<RequestOutput>* finished) {
  const std::lock_guard<std::mutex> lock(mu_);
  return StepLocked(finished);
}

absl::Status Engine::StepLocked(std::vector<RequestOutput>* finished) {
  ++stats_.steps;
  const int32_t max_batch = config_.max_batch;
  {
    ScopedTimer t(&stats_.time_bookkeeping);
    while (!swapped_.empty() && static_cast<int32_t>(running_.size()) < max_batch) {
      const int64_t id = swapped_.front();
      // Room for its blocks and its next token (at most one block per head), so the
      // swap-in is not undone by the make-room loop below.
      // Alone, it only needs its own blocks (it fitted before).
      const int32_t need =
          BKV_CHECK_VALUE(bm_->NumBlocksOf(id)) +
          (running_.empty() ? 0 : bm_->shape().num_heads_total() + config_.watermark_blocks);
      if (need > bm_->NumFreeBlocks()) break;
      BKV_RETURN_IF_ERROR(bm_->SwapIn(id));
      swapped_.pop_front();
      running_.push_back(id);
    }
  }
  while (swapped_.empty() && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < max_batch) {
    const int64_t id = waiting_.front();
    SeqState& s = *seqs_.at(id);
    const int64_t len = static_cast<int64_t>(s.request.prompt.size() +
                                             (s.out.output.empty() ? 0 : s.out.output.size() - 1));
    // The first decode step appends at once: reserve its blocks too (a head whose last
    // prompt block is full needs a new one), so the admission is not preempted right away.
    // Alone (nothing running or swapped), it only needs its prompt's blocks.
    const int32_t first_append = len % bm_->shape().block_size == 0 ? PromptBlocks(1) : 0;
    const bool alone = running_.empty();
    const int64_t need = PromptBlocks(len) + (alone ? 0 : first_append + config_.watermark_blocks);
    s.peak_blocks = config_.admission == AdmissionMode::kReserve ? PeakBlocks(s, len) : -1;
    // Room now, and with reservation room at every coming step beside the running ones.
    bool fits = need <= bm_->NumFreeBlocks();
    if (fits && !alone && config_.admission == AdmissionMode::kReserve) {
      fits = ReservationFits(s, len);
    }
    if (!fits) {
      if (alone) {
        // A preempted sequence grew past what the whole pool holds: it can never resume.
        waiting_.pop_front();
        s.out.finish_reason = FinishReason::kOutOfMemory;
        Finish(id, finished);
        continue;
      }
      break;
    }
    waiting_.pop_front();
    BKV_RETURN_IF_ERROR(Admit(s));
    if (s.out.finish_reason != FinishReason::kRunning) Finish(id, finished);
  }
  if (!running_.empty()) {
    BKV_RETURN_IF_ERROR(DecodeStep(finished));
  }
  UpdateMemoryStats();
  if (config_.verify_integrity) {
    BKV_RETURN_IF_ERROR(bm_->VerifyIntegrity());
  }
  return absl::OkStatus();
}

absl::Status Engine::DecodeStep(std::vector<RequestOutput>* finished) {
  const int64_t heads_total = bm_->shape().num_heads_total();
  {
    ScopedTimer t(&stats_.time_bookkeeping);
    // Make room for every running sequence's next token, newest admissions giving way.
    while (true) {
      int64_t needed = 0;
      for (int64_t id : running_) needed += BKV_CHECK_VALUE(bm_->BlocksNeededToAppend(id));
      if (needed <= bm_->NumFreeBlocks()) break;
      const int64_t victim = running_.back();
      if (running_.size() == 1) {
        seqs_.at(victim)->out.finish_reason = FinishReason::kOutOfMemory;
        Finish(victim, finished);
        return absl::OkStatus();
      }
      BKV_RETURN_IF_ERROR(Preempt(victim));
    }
  }
  const int64_t rows = static_cast<int64_t>(running_.size());
  std::vector<SequenceId> ids(running_.begin(), running_.end());
  std::vector<int32_t> tokens(rows), positions(rows);
  std::vector<SlotRef> slots(rows * heads_total);
  {
    ScopedTimer t(&stats_.time_bookkeeping);
    for (int64_t b = 0; b < rows; ++b) {
      BKV_RETURN_IF_ERROR(
          bm_->AppendToken(ids[b], absl::MakeSpan(slots).subspan(b * heads_total, heads_total)));
      tokens[b] = seqs_.at(ids[b])->pending;
      positions[b] = BKV_CHECK_VALUE(bm_->NextPosition(ids[b])) - 1;
    }
  }
  std::vector<SeqState*> states(rows);
  for (int64_t b = 0; b < rows; ++b) states[b] = seqs_.at(ids[b]).get();
  std::vector<absl::Span<const float>> head_bias;
  std::vector<int32_t> bias_layers(rows);  // each row's count-bias layers (CountBiasLayers)
  {
    // The count-bias terms' first cache misses, every sequence's at once (CountBias).
    ScopedTimer t(&stats_.time_bookkeeping);
    const KvShape& shape = bm_->shape();
    for (int64_t b = 0; b < rows; ++b)
      bias_layers[b] = std::min(CountBiasLayers(states[b]->policy_config), shape.num_layers);
    for (const bool counts : {true, false}) {
      for (int64_t b = 0; b < rows; ++b) {
        SeqState& s = *states[b];
        const int32_t heads = bias_layers[b] * shape.num_kv_heads;
        if (heads == 0) continue;
        auto token_at = [&s](int32_t p) { return TokenAt(s, p); };
        if (counts) {
          s.count_bias.PrefetchCounts(positions[b], heads, token_at);
        } else {
          s.count_bias.PrefetchHeads(*store_, positions[b], heads, token_at);
        }
      }
    }
  }
  for (int64_t b = 0; b < rows; ++b) {
    if (bias_layers[b] > 0)
      BKV_RETURN_IF_ERROR(AddCountBias(*states[b], positions[b], bias_layers[b], b, &head_bias));
  }
  QuerySink sink = [&](int32_t row, int32_t layer, int32_t kv_head, int32_t position,
                       const float* pre, const float* post) {
    Observe(*states[row], layer, kv_head, position, pre, post);
  };
  // Observed beside the attention, on its threads, when every running policy allows it.
  const bool concurrent = std::all_of(states.begin(), states.end(), [](const SeqState* s) {
    return s->policy->ObserveConcurrent();
  });
  const int32_t vocab = runner_.config().vocab_size;
  std::vector<float> logits(rows * vocab);
  const double scoring_before = stats_.time_scoring, start = Now();
  absl::Status st = runner_.Decode(ids, tokens, positions, slots, *bm_, *store_, &sink,
                                   logits.data(), &stats_.time_attention, &stats_.time_scoring,
                                   head_bias, concurrent, &stats_.layers_observed_in_attention);
  stats_.time_decode_forward += Now() - start - (stats_.time_scoring - scoring_before);
  BKV_RETURN_IF_ERROR(st);
  BKV_RETURN_IF_ERROR(std::exchange(observe_status_, absl::OkStatus()));
  running_sum_ += static_cast<double>(rows);
  used_blocks_sum_ += static_cast<double>(bm_->NumUsedBlocks());
  ++decode_steps_;
  UpdateMemoryStats();  // the peak is now, before the policy compresses
  std::vector<int64_t> done;
  for (int64_t b = 0; b < rows; ++b) {
    if (Accept(*states[b], absl::MakeConstSpan(logits).subspan(b * vocab, vocab)))
      done.push_back(ids[b]);
  }
  std::vector<int64_t> compress;
  for (int64_t b = 0; b < rows; ++b) {
    if (states[b]->out.finish_reason == FinishReason::kRunning) compress.push_back(ids[b]);
  }
  BKV_RETURN_IF_ERROR(Compress(compress));
  for (int64_t id : done) Finish(id, finished);
  return absl::OkStatus();
}

absl::Status Engine::Compress(absl::Span<const int64_t> ids) {
  std::vector<CompressTarget> targets;
  for (int64_t id : ids) {
    targets.push_back({id, seqs_.at(id)->policy.get(), BKV_CHECK_VALUE(bm_->NextPosition(id)) - 1});
  }
  std::vector<absl::StatusOr<std::vector<KeepSet>>> keep;
  {
    ScopedTimer t(&stats_.time_selection);
    if (scorer_ == nullptr) {
      keep = HostKeepSets(*bm_, *store_, targets, config_.num_threads);
    } else {
      BKV_ASSIGN_OR_RETURN(std::vector<std::vector<KeepSet>> scored,
                           ScoredKeepSets(*bm_, *store_, *scorer_, targets));
      keep.assign(std::make_move_iterator(scored.begin()), std::make_move_iterator(scored.end()));
    }
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    BKV_RETURN_IF_ERROR(keep[i].status());
    BKV_RETURN_IF_ERROR(
        ApplyCompression(*seqs_.at(targets[i].id), *keep[i], targets[i].current_position));
  }
  return absl::OkStatus();
}

absl::Status Engine::ApplyCompression(SeqState& s, absl::Span<const KeepSet> keep,
                                      int32_t current) {
  if (keep.empty()) return absl::OkStatus();
  ScopedTimer t(&stats_.time_compaction);
  std::vector<std::vector<int32_t>> positions(keep.size());  // each head's, before compaction
  if (s.request.record_evictions) {
    for (size_t i = 0; i < keep.size(); ++i)
      GatherHead(*bm_, *store_, s.out.id, keep[i].layer, keep[i].kv_head, nullptr, &positions[i]);
  }
  BKV_ASSIGN_OR_RETURN(CompactionPlan plan, bm_->ApplyKeepSets(s.out.id, keep));
  if (s.request.record_evictions) {  // keep-sets ApplyKeepSets accepted: ascending, in range
    for (size_t i = 0; i < keep.size(); ++i) RecordEvictions(s, keep[i], positions[i], current);
  }
  stats_.compressions += CountLayers(keep);
  stats_.tokens_evicted += plan.tokens_evicted;
  stats_.blocks_freed_by_eviction += plan.blocks_freed;
  s.out.tokens_evicted += plan.tokens_evicted;
  return absl::OkStatus();
}

void Engine::UpdateMemoryStats() {
  stats_.peak_used_blocks = std::max(stats_.peak_used_blocks, bm_->NumUsedBlocks());
  stats_.peak_running = std::max(stats_.peak_running, static_cast<int32_t>(running_.size()));
  stats_.mean_running = decode_steps_ > 0 ? running_sum_ / decode_steps_ : 0.0;
  stats_.mean_used_blocks = decode_steps_ > 0 ? used_blocks_sum_ / decode_steps_ : 0.0;
  for (int64_t id : running_) UpdatePeak(*seqs_.at(id));
}

void Engine::UpdatePeak(SeqState& s) {
  const KvShape& shape = bm_->shape();
  std::vector<int32_t> heads(shape.num_heads_total());
  BKV_CHECK(bm_->RetainedTokensOfHeads(s.out.id, absl::MakeSpan(heads)).ok());
  const int64_t tokens = std::accumulate(heads.begin(), heads.end(), int64_t{0});
  s.out.peak_retained_tokens =
      std::max(s.out.peak_retained_tokens, static_cast<double>(tokens) / shape.num_heads_total());
  s.out.peak_blocks = std::max(s.out.peak_blocks, BKV_CHECK_VALUE(bm_->NumBlocksOf(s.out.id)));
  stats_.peak_used_blocks = std::max(stats_.peak_used_blocks, bm_->NumUsedBlocks());
}

}  // namespace beaconkv
