// The KV cache behind beaconkv.vllm: a BlockManager over a host KV store, sized in blocks, with
// the two operations a vLLM step needs in C++: room for a request's new tokens (all or
// nothing, so a refusal is an ordinary scheduling answer) and one layer's attention for a
// batch of requests (write the new tokens' K/V into their per-head slots, then attend over
// what each head retains: paged decode attention for one-token rows, causal attention by
// stored position for longer rows).
//
// Threads: attention and compression run with the GIL released, so a second Python thread may
// call in meanwhile (free a sequence, admit another). Every method's C++ work runs under the
// cache's one mutex (`Locked` releases the GIL first, so the two locks are never taken in the
// opposite order; `LockedQuick` keeps the GIL only when the mutex is free at once), and
// whatever it checks about a sequence it checks under that lock: a sequence freed by another
// thread is then an ordinary "unknown sequence" error, never a policy or block freed under a
// running call.
#include <cblas.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "bindings/array_check.h"
#include "bindings/status_cast.h"
#include "block_manager/block_manager.h"
#include "core/policy.h"
#include "core/rope.h"
#include "core/scoring.h"
#include "core/status_macros.h"
#include "engine/compress_step.h"
#include "engine/count_bias.h"
#include "engine/tensor_ops.h"
#include "kernels/paged_attention_cpu.h"
#include "kernels/scorer.h"

namespace py = pybind11;

namespace beaconkv {

PolicyConfig PolicyConfigFromPython(py::handle obj);  // policy_bindings.cc

namespace {

using py_util::Check;
using py_util::FloatArray;
using py_util::IntArray;
using py_util::Unwrap;
using py_util::WithoutGil;

class VllmKvCache {
 public:
  VllmKvCache(int32_t num_layers, int32_t num_kv_heads, int32_t num_heads, int32_t head_dim,
              int32_t block_size, int32_t num_blocks, py::object policy, double rope_theta,
              bool observe, const std::string& scorer)
      : num_heads_(num_heads), observe_(observe) {
    if (scorer != "host" && scorer != "paged") {
      throw py::value_error(absl::StrFormat("scorer must be 'host' or 'paged', got '%s'", scorer));
    }
    // Our GEMMs (prefill attention, policy scoring) run in the caller's thread: OpenBLAS's
    // own pool only spun (sched_yield) beside vLLM's threads, a third of a benchmark's time.
    SetBlasSingleThreaded();
    if (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
      throw py::value_error(
          absl::StrFormat("num_heads (%d) must be a positive multiple of num_kv_heads (%d)",
                          num_heads, num_kv_heads));
    }
    BlockManagerConfig config;
    config.shape = {num_layers, num_kv_heads, head_dim, block_size};
    config.num_blocks = num_blocks;
    Check(BlockManager::ValidateConfig(config));
    store_ = std::make_unique<CpuKvStore>(num_blocks, block_size, head_dim);
    manager_ = Unwrap(BlockManager::Create(config, store_.get()));
    policy_ = PolicyConfigFromPython(policy);
    geometry_ = {num_layers, num_kv_heads, num_heads / num_kv_heads, {head_dim, rope_theta}};
    Check(ValidatePolicyGeometry(policy_, geometry_));  // not at the first sequence
    rope_ = std::make_unique<Rope>(Unwrap(Rope::Create(geometry_.rope)));
    if (scorer == "paged") scorer_ = std::make_unique<PagedTwinScorer>(store_.get());
  }

  const KvShape& shape() const { return manager_->shape(); }
  BlockManager& manager() { return *manager_; }

  // Runs `f` under `mu_` with the GIL released (other Python threads run meanwhile); returns
  // its result with the GIL held again. For the calls that do real work: attention,
  // compression. `f` must not touch Python objects, nor call another Locked method (mu_ is
  // not recursive); it may throw (Unwrap, Check): the lock is released, then the GIL re-taken.
  template <typename F>
  auto Locked(F&& f) const -> decltype(f()) {
    return WithoutGil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return f();
    });
  }
  // The same for bookkeeping of a few microseconds (what the scheduler asks per request): when
  // mu_ is free it runs with the GIL held, since giving the GIL up and taking it back can cost
  // more than the call (up to the 5 ms switch interval beside a busy Python thread); only when
  // another call holds mu_ does it release the GIL to wait. A try-lock never waits, so holding
  // the GIL here cannot deadlock with a thread that holds mu_.
  template <typename F>
  auto LockedQuick(F&& f) const -> decltype(f()) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock()) return f();
    return Locked(std::forward<F>(f));
  }

  // Blocks that `n` more tokens of `id` would take (a new sequence if `id` is unknown).
  int32_t BlocksNeeded(SequenceId id, int32_t n) const {
    return LockedQuick([&] { return BlocksNeededLocked(id, n); });
  }
  int32_t BlocksNeededLocked(SequenceId id, int32_t n) const {
    const KvShape& s = shape();
    const int32_t bs = s.block_size;
    if (!manager_->HasSequence(id)) return s.num_heads_total() * ((n + bs - 1) / bs);
    std::vector<int32_t> heads(s.num_heads_total());
    Check(manager_->RetainedTokensOfHeads(id, absl::MakeSpan(heads)));
    int32_t need = 0;
    for (const int32_t c : heads) need += (c + n + bs - 1) / bs - (c + bs - 1) / bs;
    return need;
  }

  // Whether Allocate needs the new tokens' ids: the count bias (CountBiasLayers) reads them.
  bool NeedsTokenIds() const { return CountBiasLayers(policy_) > 0; }

  // Room for `n` new tokens of `id` in every head; false (and nothing changed) when the pool
  // cannot hold them. `token_ids` (None, or the n new tokens' ids) is required when
  // NeedsTokenIds().
  bool Allocate(SequenceId id, int32_t n, int32_t prompt_len,
                const std::optional<std::vector<int32_t>>& token_ids) {
    if (n < 0) throw py::value_error(absl::StrFormat("negative token count %d", n));
    if (token_ids.has_value() && static_cast<int32_t>(token_ids->size()) != n) {
      throw py::value_error(absl::StrFormat(
          "allocate: token_ids must hold the %d new tokens' ids, got %d", n, token_ids->size()));
    }
    if (!token_ids.has_value() && NeedsTokenIds() && n > 0) {
      throw py::value_error(absl::StrFormat(
          "allocate: sequence %d: the count bias needs the token ids of its new tokens", id));
    }
    if (n == 0) return true;
    return LockedQuick([&] {
      if (BlocksNeededLocked(id, n) > manager_->NumFreeBlocks()) return false;
      if (!manager_->HasSequence(id)) {
        std::unique_ptr<PolicyState> pol = Unwrap(NewPolicyState(policy_, geometry_, prompt_len));
        Check(manager_->AddSequence(id, n));
        policies_[id] = std::move(pol);
        steps_[id] = Steps{prompt_len, n};
      } else {
        for (int32_t i = 0; i < n; ++i) Check(manager_->AppendToken(id));
        steps_[id].last_tokens = n;
      }
      if (NeedsTokenIds()) {
        std::vector<int32_t>& ids = counts_[id].tokens;
        ids.insert(ids.end(), token_ids->begin(), token_ids->end());
      }
      return true;
    });
  }

  void Free(SequenceId id) {
    LockedQuick([&] {
      policies_.erase(id);
      steps_.erase(id);
      counts_.erase(id);
      if (manager_->HasSequence(id)) Check(manager_->FreeSequence(id));
    });
  }

  bool Has(SequenceId id) const {
    return LockedQuick([&] { return manager_->HasSequence(id); });
  }

  // Reservation admission. The most blocks a sequence whose prefill is `prefill_len` tokens
  // (the prompt, or prompt + output when a preempted request is recomputed) and which ends at
  // `max_total` tokens ever holds under the policy (core PeakBlocks); None when the policy has
  // no budget trigger (full, rpc).
  std::optional<int32_t> PeakBlocks(int32_t prefill_len, int64_t max_total) const {
    const std::optional<int64_t> peak =
        beaconkv::PeakBlocks(policy_, shape(), prefill_len, max_total);
    if (!peak) return std::nullopt;
    return static_cast<int32_t>(*peak);
  }
  // Records that `id` (live), whose prefill is `prefill_len` tokens (more than it holds when its
  // prefill comes in chunks), may grow to `max_total` tokens; dropped when it is freed.
  void Reserve(SequenceId id, int64_t max_total, int32_t prefill_len) {
    LockedQuick([&] {
      if (!manager_->HasSequence(id)) {
        throw py::value_error(absl::StrFormat("reserve: unknown sequence %d", id));
      }
      steps_[id].max_total = max_total;
      steps_[id].prefill_len = prefill_len;
    });
  }

  // Reservation admission: whether a new sequence whose prefill is `prefill_len` tokens, which
  // ends by `max_total` tokens and asks for `num_tokens` now, fits now and at every coming step
  // beside the reserved sequences, each head following its policy's trigger (AddBlockDemand).
  // Heads of different sequences peak at different steps, so this admits more than reserving
  // every sequence's peak at once. A sequence alone only needs room now; without a budget
  // trigger (no reservation), room now is the rule.
  bool Admits(int32_t prefill_len, int64_t max_total, int32_t num_tokens) const {
    if (prefill_len < 0 || num_tokens < 0 || max_total < 0) {
      throw py::value_error(
          absl::StrFormat("admits: negative length (prefill_len %d, max_total %d, num_tokens %d)",
                          prefill_len, max_total, num_tokens));
    }
    return LockedQuick([&] {
      if (BlocksNeededLocked(-1, num_tokens) > manager_->NumFreeBlocks()) return false;
      if (manager_->NumUsedBlocks() == 0) return true;
      std::vector<int64_t> demand = DemandLocked();
      if (demand.empty()) return true;
      const std::vector<int32_t> heads(shape().num_heads_total(), prefill_len);
      AddBlockDemand(policy_, shape(),
                     {heads, false, std::max<int64_t>(0, max_total - prefill_len)},
                     absl::MakeSpan(demand));
      return *std::max_element(demand.begin(), demand.end()) <=
             manager_->NumUsedBlocks() + manager_->NumFreeBlocks();
    });
  }

  // The blocks the live sequences hold at each of the next steps (BlockDemandHorizon of them;
  // reserved sequences along their heads' cycles, others as they are now); empty when the
  // policy has no budget trigger.
  std::vector<int64_t> BlockDemand() const {
    return LockedQuick([&] { return DemandLocked(); });
  }
  std::vector<int64_t> DemandLocked() const {
    const std::optional<int64_t> horizon = BlockDemandHorizon(policy_);
    if (!horizon) return {};
    std::vector<int64_t> demand(*horizon, 0);
    std::vector<int32_t> heads(shape().num_heads_total());
    for (SequenceId id : manager_->SequenceIds()) {
      const Steps& st = steps_.at(id);
      if (st.max_total < 0) {
        const int32_t held = Unwrap(manager_->NumBlocksOf(id));
        for (int64_t& d : demand) d += held;
        continue;
      }
      const int64_t total = Unwrap(manager_->NextPosition(id));
      // The rest of a prefill in chunks may come at the next step: counted from now on.
      const int32_t pending = static_cast<int32_t>(std::max<int64_t>(0, st.prefill_len - total));
      Check(manager_->RetainedTokensOfHeads(id, absl::MakeSpan(heads)));
      for (int32_t& n : heads) n += pending;
      // The engine and the scheduler run the policy after a sequence's decode steps: one
      // token past its prompt.
      const bool decoding = pending == 0 && st.last_tokens == 1 && total > st.prompt_len;
      AddBlockDemand(policy_, shape(),
                     {heads, decoding, std::max<int64_t>(0, st.max_total - total - pending)},
                     absl::MakeSpan(demand));
    }
    return demand;
  }

  // Runs the sequence's policy on every layer's heads at their trigger (as the reference
  // engine does after a decode step) and frees emptied blocks at once.
  // Returns {tokens_evicted, blocks_freed, compressions, keep: [(layer, kv_head, slots)]}.
  py::dict Compress(SequenceId id, int32_t current_position) {
    int64_t evicted = 0, freed = 0, compressions = 0;
    std::vector<KeepSet> applied;  // every keep-set, layer by layer
    Check(Locked([&]() -> absl::Status {
      auto it = policies_.find(id);
      if (it == policies_.end()) {
        return absl::InvalidArgumentError(absl::StrFormat("unknown sequence %d", id));
      }
      BKV_ASSIGN_OR_RETURN(applied,
                           HostKeepSets(*manager_, *store_, *it->second, id, current_position));
      if (applied.empty()) return absl::OkStatus();
      BKV_ASSIGN_OR_RETURN(const CompactionPlan plan, manager_->ApplyKeepSets(id, applied));
      evicted = plan.tokens_evicted;
      freed = plan.blocks_freed;
      compressions = CountLayers(applied);
      return absl::OkStatus();
    }));
    py::dict out;
    out["tokens_evicted"] = evicted;
    out["blocks_freed"] = freed;
    out["compressions"] = compressions;
    py::list keep;  // [(layer, kv_head, kept slots)], for a replica pool
    for (const KeepSet& k : applied) keep.append(py::make_tuple(k.layer, k.kv_head, k.slots));
    out["keep"] = keep;
    return out;
  }

  // Compress for a step's sequences (seq_ids[i] at its newest position positions[i]): every
  // sequence's keep-sets are computed on up to `num_threads` threads (HostKeepSets: a
  // sequence, layer or head per task; the pool is only read), then applied in the given order. The
  // same decisions as Compress on each in turn: a sequence's policy sees only its own heads, and
  // applying one sequence's keep-sets does not touch another's. Returns the summed counts, and with
  // return_keep the applied keep-sets, keep: [(seq, [(layer, kv_head, slots)])] (for the
  // scheduler's replica pool when the scheduler runs in another process).
  py::dict CompressMany(const IntArray& seq_ids, const IntArray& positions, int num_threads,
                        bool return_keep) {
    if (num_threads < 1) throw py::value_error("num_threads must be >= 1");
    const int64_t n = seq_ids.size();
    if (positions.size() != n) throw py::value_error("seq_ids and positions differ in size");
    absl::flat_hash_set<SequenceId> seen;
    for (int64_t i = 0; i < n; ++i) {
      if (!seen.insert(seq_ids.at(i)).second) {
        throw py::value_error(absl::StrFormat("sequence %d appears twice", seq_ids.at(i)));
      }
    }
    std::vector<SequenceId> ids(n);
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = seq_ids.at(i), pos[i] = positions.at(i);
    int64_t evicted = 0, freed = 0, compressions = 0;
    std::vector<absl::StatusOr<std::vector<KeepSet>>> sets(n);
    Check(Locked([&]() -> absl::Status {
      std::vector<CompressTarget> targets(n);
      for (int64_t i = 0; i < n; ++i) {
        auto it = policies_.find(ids[i]);
        if (it == policies_.end()) {
          return absl::InvalidArgumentError(absl::StrFormat("unknown sequence %d", ids[i]));
        }
        targets[i] = {ids[i], it->second.get(), pos[i]};
      }
      if (scorer_ != nullptr) {
        // Every planned head of the step in one scorer call (the device's batch).
        BKV_ASSIGN_OR_RETURN(std::vector<std::vector<KeepSet>> scored,
                             ScoredKeepSets(*manager_, *store_, *scorer_, targets));
        for (int64_t i = 0; i < n; ++i) sets[i] = std::move(scored[i]);
      } else {
        sets = HostKeepSets(*manager_, *store_, targets, num_threads);
      }
      for (int64_t i = 0; i < n; ++i) {
        if (!sets[i].ok()) return sets[i].status();
        if (sets[i]->empty()) continue;
        BKV_ASSIGN_OR_RETURN(const CompactionPlan plan, manager_->ApplyKeepSets(ids[i], *sets[i]));
        evicted += plan.tokens_evicted;
        freed += plan.blocks_freed;
        compressions += CountLayers(*sets[i]);
      }
      return absl::OkStatus();
    }));
    py::dict out;
    out["tokens_evicted"] = evicted;
    out["blocks_freed"] = freed;
    out["compressions"] = compressions;
    if (return_keep) {
      py::list keep;
      for (int64_t i = 0; i < n; ++i) {
        if (sets[i]->empty()) continue;
        py::list heads;
        for (const KeepSet& k : *sets[i]) heads.append(py::make_tuple(k.layer, k.kv_head, k.slots));
        keep.append(py::make_tuple(ids[i], heads));
      }
      out["keep"] = keep;
    }
    return out;
  }

  // One layer for a batch. Row r is sequence seq_ids[r] with query_lens[r] new tokens, whose
  // slots (the last query_lens[r] of every head) were allocated by Allocate.
  void Attention(int32_t layer, const IntArray& seq_ids, const IntArray& query_lens,
                 const FloatArray& q,  // [tokens, num_heads, head_dim]
                 const FloatArray& k,  // [tokens, num_kv_heads, head_dim]
                 const FloatArray& v,  // [tokens, num_kv_heads, head_dim]
                 py::array_t<float, py::array::c_style> out, float scale, int32_t num_threads) {
    if (num_threads < 1) throw py::value_error("num_threads must be >= 1");
    const KvShape& s = shape();
    const int32_t d = s.head_dim, hkv = s.num_kv_heads, group = num_heads_ / hkv;
    const int64_t rows = seq_ids.size();
    if (query_lens.size() != rows) throw py::value_error("seq_ids and query_lens differ in size");
    std::vector<SequenceId> ids(rows);
    std::vector<int32_t> lens(rows);
    int64_t tokens = 0;
    for (int64_t r = 0; r < rows; ++r) {
      ids[r] = seq_ids.at(r);
      lens[r] = query_lens.at(r);
      if (lens[r] < 0) {
        throw py::value_error(absl::StrFormat("row %d: negative query length %d", r, lens[r]));
      }
      tokens += lens[r];
    }
    py_util::CheckShape<float>(q, "query", {py_util::AtLeast(tokens), num_heads_, d});
    py_util::CheckShape<float>(k, "key", {py_util::AtLeast(tokens), hkv, d});
    py_util::CheckShape<float>(v, "value", {py_util::AtLeast(tokens), hkv, d});
    py_util::CheckShape<float>(out, "output", {py_util::AtLeast(tokens), num_heads_, d});
    if (layer < 0 || layer >= s.num_layers) throw py::value_error("layer out of range");
    const float* qp = q.data();
    const float* kp = k.data();
    const float* vp = v.data();
    float* op = out.mutable_data();
    Check(Locked([&]() -> absl::Status {
      for (int64_t r = 0; r < rows; ++r) {
        if (!manager_->HasSequence(ids[r]) || !policies_.contains(ids[r])) {
          return absl::InvalidArgumentError(
              absl::StrFormat("row %d: sequence %d has no slots in the pool", r, ids[r]));
        }
      }
      // Decode rows go through the paged kernel together; longer rows one by one.
      std::vector<int64_t> decode_rows, decode_tokens;
      int32_t max_blocks = 1;
      int64_t t0 = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const SequenceId id = ids[r];
        const int32_t n = lens[r];
        BKV_RETURN_IF_ERROR(WriteNewTokens(id, layer, n, kp + t0 * hkv * d, vp + t0 * hkv * d));
        if (n == 1) {
          decode_rows.push_back(r);
          decode_tokens.push_back(t0);
          for (int32_t h = 0; h < hkv; ++h) {
            BKV_ASSIGN_OR_RETURN(absl::Span<const BlockId> t, manager_->BlockTable(id, layer, h));
            max_blocks = std::max<int32_t>(max_blocks, t.size());
          }
        } else if (n > 1) {
          BKV_RETURN_IF_ERROR(CausalRow(id, layer, n, qp + t0 * num_heads_ * d, scale,
                                        op + t0 * num_heads_ * d, group));
        }
        t0 += n;
      }
      if (!decode_rows.empty()) {
        const int64_t nd = decode_rows.size();
        std::vector<int32_t> tables(nd * hkv * max_blocks, 0), lengths(nd * hkv);
        std::vector<float> dq(nd * num_heads_ * d), dout(nd * num_heads_ * d);
        // The count bias of this layer's heads, [rows, kv_heads, max_blocks * block_size].
        const bool biased = layer < CountBiasLayers(policy_);
        const int64_t capacity = static_cast<int64_t>(max_blocks) * s.block_size;
        std::vector<float> bias(biased ? nd * hkv * capacity : 0, 0.0f);
        for (int64_t i = 0; i < nd; ++i) {
          const SequenceId id = ids[decode_rows[i]];
          std::copy_n(qp + decode_tokens[i] * num_heads_ * d, num_heads_ * d,
                      dq.data() + i * num_heads_ * d);
          for (int32_t h = 0; h < hkv; ++h) {
            BKV_ASSIGN_OR_RETURN(absl::Span<const BlockId> t, manager_->BlockTable(id, layer, h));
            std::copy(t.begin(), t.end(), tables.data() + (i * hkv + h) * max_blocks);
            BKV_ASSIGN_OR_RETURN(lengths[i * hkv + h], manager_->RetainedTokens(id, layer, h));
          }
          if (biased) {
            BKV_RETURN_IF_ERROR(HeadBias(
                id, layer, absl::MakeSpan(bias).subspan(i * hkv * capacity, hkv * capacity)));
          }
        }
        kernels::PagedAttentionShape shape{
            static_cast<int32_t>(nd), num_heads_, hkv, d, s.block_size, max_blocks};
        kernels::PagedDecodeAttentionCpu(dq.data(), store_->keys_data(), store_->values_data(),
                                         tables.data(), lengths.data(), shape, scale, dout.data(),
                                         num_threads, biased ? bias.data() : nullptr);
        for (int64_t i = 0; i < nd; ++i) {
          std::copy_n(dout.data() + i * num_heads_ * d, num_heads_ * d,
                      op + decode_tokens[i] * num_heads_ * d);
        }
      }
      return observe_ ? ObserveStep(layer, ids, lens, qp) : absl::OkStatus();
    }));
  }

  // Keys [n, head_dim] and positions [n] of one head, slot order (the policy's input).
  py::tuple ReadHead(SequenceId id, int32_t layer, int32_t kv_head) const {
    const int32_t d = shape().head_dim;
    std::vector<float> k;
    std::vector<int32_t> p;
    Locked([&] {
      const int32_t n = Unwrap(manager_->RetainedTokens(id, layer, kv_head));
      k.resize(static_cast<size_t>(n) * d);
      p.resize(n);
      for (int32_t t = 0; t < n; ++t) {
        const SlotRef slot = Unwrap(manager_->Slot(id, layer, kv_head, t));
        std::copy_n(store_->key(slot), d, k.data() + static_cast<size_t>(t) * d);
        p[t] = store_->position(slot);
      }
    });
    const auto n = static_cast<py::ssize_t>(p.size());
    FloatArray keys({n, static_cast<py::ssize_t>(d)});
    std::copy(k.begin(), k.end(), keys.mutable_data());
    py::array_t<int32_t> pos(n);
    std::copy(p.begin(), p.end(), pos.mutable_data());
    return py::make_tuple(keys, pos);
  }

  py::array_t<int32_t> HeadTokens(SequenceId id) const {
    const KvShape& s = shape();
    py::array_t<int32_t> out({s.num_layers, s.num_kv_heads});
    std::vector<int32_t> tokens(static_cast<size_t>(s.num_layers) * s.num_kv_heads);
    LockedQuick([&] {
      for (int32_t l = 0; l < s.num_layers; ++l)
        for (int32_t h = 0; h < s.num_kv_heads; ++h)
          tokens[l * s.num_kv_heads + h] = Unwrap(manager_->RetainedTokens(id, l, h));
    });
    std::copy(tokens.begin(), tokens.end(), out.mutable_data());
    return out;
  }

  py::dict ApplyKeepSets(SequenceId id,
                         const std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>>& keep) {
    std::vector<KeepSet> sets;
    for (const auto& [head, slots] : keep) sets.push_back({head.first, head.second, slots});
    const CompactionPlan plan = Unwrap(Locked([&] { return manager_->ApplyKeepSets(id, sets); }));
    py::dict out;
    out["tokens_evicted"] = plan.tokens_evicted;
    out["blocks_freed"] = plan.blocks_freed;
    return out;
  }

 private:
  // The count bias of every kv head of `id` in `layer` (out: [kv_heads, capacity], logical slot
  // order), its newest token being the one this step decodes.
  absl::Status HeadBias(SequenceId id, int32_t layer, absl::Span<float> out) {
    auto it = counts_.find(id);
    BKV_ASSIGN_OR_RETURN(const int32_t next, manager_->NextPosition(id));
    if (it == counts_.end() || static_cast<int32_t>(it->second.tokens.size()) != next) {
      return absl::InternalError(absl::StrFormat(
          "sequence %d: the pool holds %d positions but knows the ids of %d", id, next,
          it == counts_.end() ? 0 : static_cast<int32_t>(it->second.tokens.size())));
    }
    Counts& c = it->second;
    const int32_t hkv = shape().num_kv_heads;
    const int64_t capacity = static_cast<int64_t>(out.size()) / hkv;
    for (int32_t h = 0; h < hkv; ++h) {
      BKV_ASSIGN_OR_RETURN(const absl::Span<const float> b,
                           c.bias.Head(*manager_, *store_, id, layer, h, next - 1, [&](int32_t p) {
                             return c.tokens[static_cast<size_t>(p)];
                           }));
      std::copy(b.begin(), b.end(), out.begin() + h * capacity);
    }
    return absl::OkStatus();
  }

  // The policy of every row observes the step's queries of every (layer, kv_head): post-RoPE
  // as computed, pre-RoPE recovered by rotating back by the token's position.
  absl::Status ObserveStep(int32_t layer, absl::Span<const SequenceId> seq_ids,
                           absl::Span<const int32_t> query_lens, const float* q) {
    const int32_t d = shape().head_dim, hkv = shape().num_kv_heads, group = num_heads_ / hkv;
    std::vector<float> pre(group * d), keys;
    std::vector<int32_t> positions;
    int64_t t0 = 0;
    for (int64_t r = 0; r < static_cast<int64_t>(seq_ids.size()); ++r) {
      const SequenceId id = seq_ids[r];
      const int32_t n = query_lens[r];
      PolicyState& pol = *policies_.at(id);
      for (int32_t h = 0; h < hkv; ++h) {
        BKV_ASSIGN_OR_RETURN(const int32_t c, manager_->RetainedTokens(id, layer, h));
        for (int32_t i = 0; i < n; ++i) {
          BKV_ASSIGN_OR_RETURN(const SlotRef slot, manager_->Slot(id, layer, h, c - n + i));
          const int32_t pos = store_->position(slot);
          const float* post = q + ((t0 + i) * num_heads_ + h * group) * d;
          rope_->RotateMany(post, group, -static_cast<int64_t>(pos), pre.data());
          HeadKeys hk;
          if (pol.NeedsKeysOnObserve())
            hk = GatherHead(*manager_, *store_, id, layer, h, &keys, &positions);
          absl::Status st = pol.Observe(layer, h, StepQueries{pos, pre.data(), post},
                                        pol.NeedsKeysOnObserve() ? &hk : nullptr);
          if (!st.ok()) return st;
        }
      }
      t0 += n;
    }
    return absl::OkStatus();
  }

  absl::Status WriteNewTokens(SequenceId id, int32_t layer, int32_t n, const float* k,
                              const float* v) {
    const int32_t d = shape().head_dim, hkv = shape().num_kv_heads;
    for (int32_t h = 0; h < hkv; ++h) {
      BKV_ASSIGN_OR_RETURN(const int32_t c, manager_->RetainedTokens(id, layer, h));
      if (n > c) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "sequence %d: %d new tokens, but only %d slots allocated in layer %d head %d", id, n, c,
            layer, h));
      }
      for (int32_t i = 0; i < n; ++i) {
        BKV_ASSIGN_OR_RETURN(const SlotRef slot, manager_->Slot(id, layer, h, c - n + i));
        std::copy_n(k + (static_cast<int64_t>(i) * hkv + h) * d, d, store_->key(slot));
        std::copy_n(v + (static_cast<int64_t>(i) * hkv + h) * d, d, store_->value(slot));
      }
    }
    return absl::OkStatus();
  }

  // Attention of n new query tokens over every retained slot whose position is not after
  // the query's (the new tokens are the head's last n slots). Per kv head: the retained keys
  // and values gathered once, then for chunks of query rows (all heads of the group) one GEMM
  // for the logits, a softmax per row over the slots it may see, one GEMM for the output.
  absl::Status CausalRow(SequenceId id, int32_t layer, int32_t n, const float* q, float scale,
                         float* out, int32_t group) {
    const int32_t d = shape().head_dim, hkv = shape().num_kv_heads;
    constexpr int32_t kChunk = 128;  // query tokens per GEMM: bounds the logits to chunk x c
    std::vector<float> keys, values, qm, logits, om;
    std::vector<int32_t> positions;
    for (int32_t h = 0; h < hkv; ++h) {
      const int32_t c = Unwrap(manager_->RetainedTokens(id, layer, h));
      keys.resize(static_cast<size_t>(c) * d);
      values.resize(static_cast<size_t>(c) * d);
      positions.resize(c);
      for (int32_t j = 0; j < c; ++j) {
        const SlotRef slot = Unwrap(manager_->Slot(id, layer, h, j));
        std::copy_n(store_->key(slot), d, keys.data() + static_cast<size_t>(j) * d);
        std::copy_n(store_->value(slot), d, values.data() + static_cast<size_t>(j) * d);
        positions[j] = store_->position(slot);
      }
      // Slots are in position order (tokens are appended in order and keep-sets are
      // ascending), so a query sees a prefix of them.
      if (!std::is_sorted(positions.begin(), positions.end())) {
        return absl::InternalError(absl::StrFormat(
            "sequence %d layer %d head %d: slots out of position order", id, layer, h));
      }
      for (int32_t i0 = 0; i0 < n; i0 += kChunk) {
        const int32_t m = std::min(kChunk, n - i0), rows = m * group;
        qm.resize(static_cast<size_t>(rows) * d);
        for (int32_t i = 0; i < m; ++i) {  // the group's heads of token i0+i are contiguous
          std::copy_n(q + (static_cast<int64_t>(i0 + i) * num_heads_ + h * group) * d, group * d,
                      qm.data() + static_cast<size_t>(i) * group * d);
        }
        logits.resize(static_cast<size_t>(rows) * c);  // written in full by the GEMM
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, c, d, scale, qm.data(), d,
                    keys.data(), d, 0.0f, logits.data(), c);
        for (int32_t i = 0; i < m; ++i) {
          const int32_t qpos = positions[c - n + i0 + i];
          const auto seen = static_cast<int32_t>(
              std::upper_bound(positions.begin(), positions.end(), qpos) - positions.begin());
          for (int32_t g = 0; g < group; ++g) {
            float* row = logits.data() + static_cast<size_t>(i * group + g) * c;
            SoftmaxInPlace(row, seen);
            std::fill(row + seen, row + c, 0.0f);
          }
        }
        om.resize(static_cast<size_t>(rows) * d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, c, 1.0f, logits.data(), c,
                    values.data(), d, 0.0f, om.data(), d);
        for (int32_t i = 0; i < m; ++i) {
          std::copy_n(om.data() + static_cast<size_t>(i) * group * d, group * d,
                      out + (static_cast<int64_t>(i0 + i) * num_heads_ + h * group) * d);
        }
      }
    }
    return absl::OkStatus();
  }

  int32_t num_heads_;
  bool observe_;  // the policy looks at queries (every policy but full)
  PolicyConfig policy_;
  PolicyGeometry geometry_;
  std::unique_ptr<Rope> rope_;
  absl::flat_hash_map<SequenceId, std::unique_ptr<PolicyState>> policies_;  // [live sequences]
  struct Steps {              // what reservation admission needs of a live sequence
    int32_t prompt_len = 0;   // as given to its first Allocate
    int32_t last_tokens = 0;  // tokens its last allocation added (1 past the prompt: decoding)
    int64_t max_total = -1;   // tokens it ends by (Reserve); -1: not reserved
    int32_t prefill_len = 0;  // its whole prefill (Reserve)
  };
  absl::flat_hash_map<SequenceId, Steps> steps_;  // [live sequences]
  struct Counts {                                 // what the count bias needs of a live sequence
    std::vector<int32_t> tokens;                  // the id at each position allocated so far
    CountBias bias;
  };
  absl::flat_hash_map<SequenceId, Counts> counts_;  // [live sequences] when NeedsTokenIds()
  std::unique_ptr<CpuKvStore> store_;
  std::unique_ptr<BlockManager> manager_;
  // "paged": compress_many scores through the device pipeline's CPU twin (ScoredKeepSets).
  std::unique_ptr<Scorer> scorer_;
  mutable std::mutex mu_;  // held by every call's C++ work (Locked)
};

}  // namespace

void BindVllm(py::module_& m) {
  using C = VllmKvCache;
  // A property that reads the block manager under the cache's lock.
  auto read = [](auto f) {
    return [f](C& c) { return c.LockedQuick([&] { return f(c.manager()); }); };
  };
  py::class_<C>(m, "VllmKvCache",
                "Head-granular KV cache for beaconkv.vllm: per-step room and batched attention.")
      .def(py::init<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, py::object, double, bool,
                    const std::string&>(),
           py::arg("num_layers"), py::arg("num_kv_heads"), py::arg("num_heads"),
           py::arg("head_dim"), py::arg("block_size"), py::arg("num_blocks"),
           py::arg("policy") = "full", py::arg("rope_theta") = 1e6, py::arg("observe") = false,
           py::arg("scorer") = "host")
      .def_property_readonly("block_size", [](const C& c) { return c.shape().block_size; })
      .def("blocks_needed", &C::BlocksNeeded, py::arg("seq_id"), py::arg("num_tokens"))
      .def("allocate", &C::Allocate, py::arg("seq_id"), py::arg("num_tokens"),
           py::arg("prompt_len") = 0, py::arg("token_ids") = py::none(),
           "Room for num_tokens more tokens in every head; False (nothing changed) if full. "
           "token_ids (the new tokens' ids) is required when needs_token_ids.")
      .def_property_readonly("needs_token_ids", &C::NeedsTokenIds,
                             "Whether allocate needs the token ids (the count bias reads them).")
      .def("free", &C::Free, py::arg("seq_id"), "Frees a sequence (unknown ids are ignored).")
      .def("peak_blocks", &C::PeakBlocks, py::arg("prefill_len"), py::arg("max_total"),
           "Most blocks a sequence ever holds under the policy, or None when unbounded.")
      .def("reserve", &C::Reserve, py::arg("seq_id"), py::arg("max_total"),
           py::arg("prefill_len") = 0,
           "Records that a live sequence (whose whole prefill is prefill_len tokens) may grow "
           "to max_total tokens (dropped when it is freed); admits() then follows its heads' "
           "cycles.")
      .def("admits", &C::Admits, py::arg("prefill_len"), py::arg("max_total"),
           py::arg("num_tokens"),
           "Whether a new sequence fits now and at every coming step beside the reserved ones.")
      .def("block_demand", &C::BlockDemand,
           "Blocks the live sequences hold at each of the next steps (reserved ones along their "
           "heads' cycles); empty without a budget trigger.")
      .def("has", &C::Has, py::arg("seq_id"))
      .def("attention", &C::Attention, py::arg("layer"), py::arg("seq_ids"), py::arg("query_lens"),
           py::arg("query"), py::arg("key"), py::arg("value"), py::arg("output").noconvert(),
           py::arg("scale"), py::arg("num_threads") = 1,
           "One layer: writes K/V [tokens, kv_heads, d] into the new slots, output [tokens, heads, "
           "d].")
      .def("read_head", &C::ReadHead, py::arg("seq_id"), py::arg("layer"), py::arg("kv_head"))
      .def("head_tokens", &C::HeadTokens, py::arg("seq_id"), "[num_layers, num_kv_heads]")
      .def("apply_keep_sets", &C::ApplyKeepSets, py::arg("seq_id"), py::arg("keep"))
      .def("compress_many", &C::CompressMany, py::arg("seq_ids"), py::arg("positions"),
           py::arg("num_threads") = 1, py::arg("return_keep") = false,
           "compress for several sequences (keep-sets chosen on up to num_threads threads, or "
           "with scorer='paged' every planned head in one scorer call; applied in order); returns "
           "the summed counts (and with return_keep, keep: "
           "[(seq, [(layer, kv_head, slots)])]).")
      .def("compress", &C::Compress, py::arg("seq_id"), py::arg("current_position"),
           "The policy on the heads at their trigger; emptied blocks are freed at once.")
      .def_property_readonly("num_free_blocks",
                             read([](const BlockManager& m) { return m.NumFreeBlocks(); }))
      .def_property_readonly("num_used_blocks",
                             read([](const BlockManager& m) { return m.NumUsedBlocks(); }))
      .def_property_readonly("num_usable_blocks",
                             read([](const BlockManager& m) { return m.NumUsableBlocks(); }))
      .def_property_readonly("sequence_ids",
                             read([](const BlockManager& m) { return m.SequenceIds(); }))
      .def("verify_integrity",
           [](C& c) { Check(c.Locked([&] { return c.manager().VerifyIntegrity(); })); });
}

}  // namespace beaconkv
