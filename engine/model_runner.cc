#include "engine/model_runner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "engine/tensor_ops.h"
#include "kernels/paged_attention_cpu.h"

namespace beaconkv {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<ModelRunner> ModelRunner::Create(ModelWeights weights, int num_threads,
                                                bool batch_invariant) {
  BKV_RETURN_IF_ERROR(weights.config.Validate());
  RopeConfig rc;
  rc.head_dim = weights.config.head_dim;
  rc.rope_theta = weights.config.rope_theta;
  BKV_ASSIGN_OR_RETURN(Rope rope, Rope::Create(rc));
  SetBlasSingleThreaded();
  return ModelRunner(std::move(weights), std::move(rope), num_threads < 1 ? 1 : num_threads,
                     batch_invariant);
}

void ModelRunner::Dense(const float* x, const std::vector<float>& w, const float* bias,
                        int64_t rows, int64_t in, int64_t out, float* y) const {
  if (batch_invariant_) {
    Linear(x, w.data(), bias, rows, in, out, y, num_threads_);
  } else {
    LinearGemm(x, w.data(), bias, rows, in, out, y, num_threads_);
  }
}

void ModelRunner::ProjectQkv(const LayerWeights& lw, const float* h, int64_t rows,
                             absl::Span<const int32_t> positions, float* q, float* q_pre, float* k,
                             float* v) const {
  const ModelConfig& c = config();
  const int64_t d = c.head_dim, hq = c.num_heads * d, hkv = c.num_kv_heads * d;
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  Dense(h, lw.q_proj, bias(lw.q_bias), rows, c.hidden_size, hq, q);
  Dense(h, lw.k_proj, bias(lw.k_bias), rows, c.hidden_size, hkv, k);
  Dense(h, lw.v_proj, bias(lw.v_bias), rows, c.hidden_size, hkv, v);
  if (!lw.q_norm.empty()) RmsNorm(q, lw.q_norm.data(), rows * c.num_heads, d, c.rms_norm_eps, q);
  if (!lw.k_norm.empty()) RmsNorm(k, lw.k_norm.data(), rows * c.num_kv_heads, d, c.rms_norm_eps, k);
  std::copy_n(q, rows * hq, q_pre);
  for (int64_t r = 0; r < rows; ++r) {
    rope_.RotateMany(q + r * hq, c.num_heads, positions[r], q + r * hq);
    rope_.RotateMany(k + r * hkv, c.num_kv_heads, positions[r], k + r * hkv);
  }
}

void ModelRunner::Mlp(const LayerWeights& lw, float* x, int64_t rows) const {
  const ModelConfig& c = config();
  const int64_t hid = c.hidden_size, inter = c.intermediate_size;
  std::vector<float> h(rows * hid), gate(rows * inter), up(rows * inter), down(rows * hid);
  RmsNorm(x, lw.post_norm.data(), rows, hid, c.rms_norm_eps, h.data());
  Dense(h.data(), lw.gate_proj, nullptr, rows, hid, inter, gate.data());
  Dense(h.data(), lw.up_proj, nullptr, rows, hid, inter, up.data());
  SiluMul(gate.data(), up.data(), rows * inter);
  Dense(gate.data(), lw.down_proj, nullptr, rows, inter, hid, down.data());
  for (int64_t i = 0; i < rows * hid; ++i) x[i] += down[i];
}

void ModelRunner::Logits(const float* x, int64_t rows, float* logits) const {
  const ModelConfig& c = config();
  std::vector<float> h(rows * c.hidden_size);
  RmsNorm(x, weights_.final_norm.data(), rows, c.hidden_size, c.rms_norm_eps, h.data());
  Dense(h.data(), weights_.lm_head, nullptr, rows, c.hidden_size, c.vocab_size, logits);
}

absl::Status ModelRunner::Prefill(SequenceId seq, absl::Span<const int32_t> tokens,
                                  const BlockManager& bm, CpuKvStore& store, const QuerySink* sink,
                                  float* last_logits, double* observe_seconds) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hid = c.hidden_size, d = c.head_dim, group = group_size();
  const int64_t hq = c.num_heads * d, hkv = c.num_kv_heads * d;
  if (n == 0) return absl::InvalidArgumentError("prefill of an empty token list");
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, c.vocab_size));
  }
  for (int32_t g = 0; g < c.num_kv_heads; ++g) {
    BKV_ASSIGN_OR_RETURN(int32_t held, bm.RetainedTokens(seq, 0, g));
    if (held != n)
      return absl::InvalidArgumentError(absl::StrFormat(
          "prefill of %d tokens, but sequence %d holds %d slots per head", n, seq, held));
  }
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
  std::vector<float> x(n * hid), h(n * hid), q(n * hq), q_pre(n * hq), k(n * hkv), v(n * hkv),
      attn(n * hq), o(n * hid);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(weights_.embed.data() + tokens[i] * hid, hid, x.data() + i * hid);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    RmsNorm(x.data(), lw.input_norm.data(), n, hid, c.rms_norm_eps, h.data());
    ProjectQkv(lw, h.data(), n, positions, q.data(), q_pre.data(), k.data(), v.data());
    for (int32_t g = 0; g < c.num_kv_heads; ++g) {
      for (int64_t i = 0; i < n; ++i) {
        BKV_ASSIGN_OR_RETURN(const SlotRef slot, bm.Slot(seq, l, g, static_cast<int32_t>(i)));
        std::copy_n(k.data() + i * hkv + g * d, d, store.key(slot));
        std::copy_n(v.data() + i * hkv + g * d, d, store.value(slot));
      }
    }
    if (sink != nullptr) {
      const double observe_start = Now();
      for (int64_t i = 0; i < n; ++i)
        for (int32_t g = 0; g < c.num_kv_heads; ++g)
          (*sink)(static_cast<int32_t>(i), l, g, static_cast<int32_t>(i),
                  q_pre.data() + i * hq + g * group * d, q.data() + i * hq + g * group * d);
      if (observe_seconds != nullptr) *observe_seconds += Now() - observe_start;
    }
    // Causal attention over the prompt, one (query head, token) at a time.
    const bool parallel = num_threads_ > 1 && n * n * c.num_heads * d >= (1 << 21);
#pragma omp parallel for num_threads(num_threads_) if (parallel) schedule(dynamic, 8) collapse(2)
    for (int32_t hh = 0; hh < c.num_heads; ++hh) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = hh / group;
        std::vector<float> p(i + 1);
        const float* qi = q.data() + i * hq + hh * d;
        for (int64_t j = 0; j <= i; ++j) p[j] = Dot(qi, k.data() + j * hkv + g * d, d) * scale;
        SoftmaxInPlace(p.data(), i + 1);
        float* out = attn.data() + i * hq + hh * d;
        std::fill_n(out, d, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float* vj = v.data() + j * hkv + g * d;
          for (int64_t e = 0; e < d; ++e) out[e] += p[j] * vj[e];
        }
      }
    }
    Dense(attn.data(), lw.o_proj, nullptr, n, hq, hid, o.data());
    for (int64_t i = 0; i < n * hid; ++i) x[i] += o[i];
    Mlp(lw, x.data(), n);
  }
  if (last_logits != nullptr) Logits(x.data() + (n - 1) * hid, 1, last_logits);
  return absl::OkStatus();
}

absl::Status ModelRunner::Decode(absl::Span<const SequenceId> seqs,
                                 absl::Span<const int32_t> tokens,
                                 absl::Span<const int32_t> positions,
                                 absl::Span<const SlotRef> slots, const BlockManager& bm,
                                 CpuKvStore& store, const QuerySink* sink, float* logits,
                                 double* attention_seconds, double* observe_seconds,
                                 absl::Span<const absl::Span<const float>> head_bias,
                                 bool sink_concurrent, int64_t* layers_observed_in_region) const {
  const ModelConfig& c = config();
  const int64_t rows = static_cast<int64_t>(seqs.size());
  const int64_t hid = c.hidden_size, d = c.head_dim, group = group_size();
  const int64_t hq = c.num_heads * d, hkv = c.num_kv_heads * d;
  const int64_t heads_total = static_cast<int64_t>(c.num_layers) * c.num_kv_heads;
  if (tokens.size() != seqs.size() || positions.size() != seqs.size() ||
      static_cast<int64_t>(slots.size()) != rows * heads_total ||
      (!head_bias.empty() && static_cast<int64_t>(head_bias.size()) != rows * heads_total)) {
    return absl::InvalidArgumentError(
        "decode: seqs, tokens, positions, slots and head_bias disagree");
  }
  for (int64_t b = 0; b < rows; ++b) {
    if (tokens[b] < 0 || tokens[b] >= c.vocab_size)
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d of sequence %d is outside the vocabulary [0, %d)", tokens[b],
                          seqs[b], c.vocab_size));
  }
  // Each head's block table and length, gathered once per step: [rows, heads_total].
  std::vector<absl::Span<const BlockId>> tables(rows * heads_total);
  std::vector<int32_t> lengths(rows * heads_total);
  for (int64_t b = 0; b < rows; ++b)
    for (int32_t l = 0; l < c.num_layers; ++l)
      for (int32_t g = 0; g < c.num_kv_heads; ++g) {
        const int64_t idx = b * heads_total + l * c.num_kv_heads + g;
        BKV_ASSIGN_OR_RETURN(absl::Span<const BlockId> t, bm.BlockTable(seqs[b], l, g));
        tables[idx] = t;
        BKV_ASSIGN_OR_RETURN(lengths[idx], bm.RetainedTokens(seqs[b], l, g));
        if (!head_bias.empty() && !head_bias[idx].empty() &&
            static_cast<int64_t>(head_bias[idx].size()) != lengths[idx]) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "decode: head_bias of sequence %d layer %d kv head %d has %d terms for %d slots",
              seqs[b], l, g, head_bias[idx].size(), lengths[idx]));
        }
      }
  const int32_t bs = bm.shape().block_size;
  std::vector<float> x(rows * hid), h(rows * hid), q(rows * hq), q_pre(rows * hq), k(rows * hkv),
      v(rows * hkv), attn(rows * hq), o(rows * hid);
  for (int64_t b = 0; b < rows; ++b)
    std::copy_n(weights_.embed.data() + tokens[b] * hid, hid, x.data() + b * hid);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    RmsNorm(x.data(), lw.input_norm.data(), rows, hid, c.rms_norm_eps, h.data());
    ProjectQkv(lw, h.data(), rows, positions, q.data(), q_pre.data(), k.data(), v.data());
    for (int64_t b = 0; b < rows; ++b)
      for (int32_t g = 0; g < c.num_kv_heads; ++g) {
        const SlotRef slot = slots[b * heads_total + l * c.num_kv_heads + g];
        std::copy_n(k.data() + b * hkv + g * d, d, store.key(slot));
        std::copy_n(v.data() + b * hkv + g * d, d, store.value(slot));
      }
    // This layer's block tables, padded to the longest: [rows, num_kv_heads, max_blocks].
    int32_t max_blocks = 0;
    for (int64_t b = 0; b < rows; ++b)
      for (int32_t g = 0; g < c.num_kv_heads; ++g)
        max_blocks = std::max<int32_t>(
            max_blocks,
            static_cast<int32_t>(tables[b * heads_total + l * c.num_kv_heads + g].size()));
    std::vector<int32_t> flat_tables(rows * c.num_kv_heads * max_blocks, kNullBlock);
    std::vector<int32_t> flat_lengths(rows * c.num_kv_heads);
    for (int64_t b = 0; b < rows; ++b)
      for (int32_t g = 0; g < c.num_kv_heads; ++g) {
        const int64_t src = b * heads_total + l * c.num_kv_heads + g, dst = b * c.num_kv_heads + g;
        std::copy(tables[src].begin(), tables[src].end(), flat_tables.begin() + dst * max_blocks);
        flat_lengths[dst] = lengths[src];
      }
    // This layer's bias terms, [rows, num_kv_heads, max_blocks * block_size]; none if no head
    // of the layer has any.
    std::vector<float> flat_bias;
    for (int64_t b = 0; b < rows && !head_bias.empty(); ++b)
      for (int32_t g = 0; g < c.num_kv_heads; ++g) {
        const absl::Span<const float> src = head_bias[b * heads_total + l * c.num_kv_heads + g];
        if (src.empty()) continue;
        const int64_t stride = int64_t{max_blocks} * bs;
        if (flat_bias.empty()) flat_bias.assign(rows * c.num_kv_heads * stride, 0.0f);
        std::copy(src.begin(), src.end(), flat_bias.begin() + (b * c.num_kv_heads + g) * stride);
      }
    const double t0 = Now();
    kernels::PagedAttentionShape shape;
    shape.rows = static_cast<int32_t>(rows);
    shape.num_heads = c.num_heads;
    shape.num_kv_heads = c.num_kv_heads;
    shape.head_dim = c.head_dim;
    shape.block_size = bs;
    shape.max_blocks = max_blocks;
    // With a concurrent sink and attention split over threads, each head's observation right
    // after its attention, its time summed per thread ([num_threads], each slot written by its
    // own thread). (On one thread the calls follow the layer's attention, timed once, as they
    // always did.)
    const bool fused =
        sink != nullptr && sink_concurrent &&
        kernels::PagedDecodeAttentionSplits(flat_lengths.data(), shape, num_threads_);
    std::vector<double> per_thread;
    std::exception_ptr thrown;  // the first exception of a call, rethrown after the region
    std::mutex thrown_mu;
    std::function<void(int32_t, int32_t)> observe;
    if (fused) {
      per_thread.assign(num_threads_, 0.0);
      observe = [&](int32_t b, int32_t g) {
        const double start = Now();
        try {
          (*sink)(b, l, g, positions[b], q_pre.data() + b * hq + g * group * d,
                  q.data() + b * hq + g * group * d);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(thrown_mu);
          if (!thrown) thrown = std::current_exception();
        }
        per_thread[omp_get_thread_num()] += Now() - start;
      };
    }
    kernels::PagedDecodeAttentionCpu(
        q.data(), store.keys_data(), store.values_data(), flat_tables.data(), flat_lengths.data(),
        shape, scale, attn.data(), num_threads_, flat_bias.empty() ? nullptr : flat_bias.data(),
        observe ? &observe : nullptr);
    if (thrown) std::rethrow_exception(thrown);
    double region = Now() - t0;
    if (observe) {
      // The observations' share of the region's wall time: the largest of the threads' summed
      // call times (a thread the machine does not run leaves the other to observe every head).
      const double share =
          std::min(*std::max_element(per_thread.begin(), per_thread.end()), region);
      region -= share;
      if (observe_seconds != nullptr) *observe_seconds += share;
      if (layers_observed_in_region != nullptr) ++*layers_observed_in_region;
    }
    if (attention_seconds != nullptr) *attention_seconds += region;
    if (sink != nullptr && !fused) {
      const double observe_start = Now();
      for (int64_t b = 0; b < rows; ++b)
        for (int32_t g = 0; g < c.num_kv_heads; ++g)
          (*sink)(static_cast<int32_t>(b), l, g, positions[b],
                  q_pre.data() + b * hq + g * group * d, q.data() + b * hq + g * group * d);
      if (observe_seconds != nullptr) *observe_seconds += Now() - observe_start;
    }
    Dense(attn.data(), lw.o_proj, nullptr, rows, hq, hid, o.data());
    for (int64_t i = 0; i < rows * hid; ++i) x[i] += o[i];
    Mlp(lw, x.data(), rows);
  }
  Logits(x.data(), rows, logits);
  return absl::OkStatus();
}

}  // namespace beaconkv
