// Python view of the reference engine. Every call into the Engine runs without the GIL (the
// Engine serializes calls with its own mutex, so a thread waiting for it must not hold the
// GIL); statuses are converted once the GIL is held again.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "bindings/status_cast.h"
#include "engine/engine.h"
#include "engine/model_policy.h"

namespace py = pybind11;

namespace beaconkv {

PolicyConfig PolicyConfigFromPython(py::handle obj);  // policy_bindings.cc

namespace {

using py_util::Check;
using py_util::Unwrap;
using py_util::WithoutGil;

PreemptionMode ParsePreemption(const std::string& s) {
  if (s == "recompute") return PreemptionMode::kRecompute;
  if (s == "swap") return PreemptionMode::kSwap;
  throw py::value_error(absl::StrFormat("preemption must be 'recompute' or 'swap', got '%s'", s));
}

AdmissionMode ParseAdmission(const std::string& s) {
  if (s == "optimistic") return AdmissionMode::kOptimistic;
  if (s == "reserve") return AdmissionMode::kReserve;
  throw py::value_error(
      absl::StrFormat("admission must be 'optimistic' or 'reserve', got '%s'", s));
}

ScorerKind ParseScorer(const std::string& s) {
  if (s == "host") return ScorerKind::kHost;
  if (s == "paged") return ScorerKind::kPaged;
  throw py::value_error(absl::StrFormat("scorer must be 'host' or 'paged', got '%s'", s));
}

// (evicted_at [layers, kv_heads, positions] int64, first eviction step): NEVER_EVICTED where
// none.
py::tuple EvictionsToPython(const EvictionRecord& r) {
  py::array_t<int64_t> a({static_cast<py::ssize_t>(r.num_layers),
                          static_cast<py::ssize_t>(r.num_kv_heads),
                          static_cast<py::ssize_t>(r.num_positions)});
  std::copy(r.evicted_at.begin(), r.evicted_at.end(), a.mutable_data());
  return py::make_tuple(a, r.first_step);
}

py::dict ToDict(RequestOutput&& o, int32_t vocab) {
  py::dict d;
  d["id"] = o.id;
  d["prompt_len"] = o.prompt_len;
  d["output"] = o.output;
  d["finish_reason"] = std::string(FinishReasonName(o.finish_reason));
  d["peak_retained_tokens"] = o.peak_retained_tokens;
  d["peak_blocks"] = o.peak_blocks;
  d["num_preemptions"] = o.num_preemptions;
  d["tokens_evicted"] = o.tokens_evicted;
  if (!o.logits.empty()) {
    const py::ssize_t rows = static_cast<py::ssize_t>(o.logits.size() / vocab);
    py::array_t<float> a({rows, static_cast<py::ssize_t>(vocab)});
    std::copy(o.logits.begin(), o.logits.end(), a.mutable_data());
    d["logits"] = a;
  } else {
    d["logits"] = py::none();
  }
  if (o.evictions.num_layers > 0) {  // the request asked for its evictions
    py::tuple ev = EvictionsToPython(o.evictions);
    d["evicted_at"] = ev[0];
    d["first_eviction_step"] = ev[1];
  }
  return d;
}

}  // namespace

void BindEngine(py::module_& m) {
  m.attr("NEVER_EVICTED") = kNeverEvicted;
  py::class_<Engine>(m, "Engine", "The reference engine over the head-granular paged KV cache.")
      .def(py::init([](const std::string& model_dir, py::object policy, int32_t block_size,
                       int32_t num_blocks, int32_t num_host_blocks, int32_t max_batch,
                       int32_t watermark_blocks, const std::string& preemption, int32_t num_threads,
                       int32_t max_model_len, bool verify_integrity, bool batch_invariant,
                       bool allow_nonfinite, const std::string& admission,
                       const std::string& scorer) {
             EngineConfig c;
             // A spec string may name "model": this engine's model directory says what.
             c.policy = py::isinstance<py::str>(policy)
                            ? Unwrap(BuildModelPolicyConfig(
                                  {policy.cast<std::string>(), {}, {}, {}}, model_dir))
                            : PolicyConfigFromPython(policy);
             c.block_size = block_size;
             c.num_blocks = num_blocks;
             c.num_host_blocks = num_host_blocks;
             c.max_batch = max_batch;
             c.watermark_blocks = watermark_blocks;
             c.preemption = ParsePreemption(preemption);
             c.admission = ParseAdmission(admission);
             c.scorer = ParseScorer(scorer);
             c.num_threads = num_threads;
             c.max_model_len = max_model_len;
             c.verify_integrity = verify_integrity;
             c.batch_invariant = batch_invariant;
             c.allow_nonfinite_weights = allow_nonfinite;
             return Unwrap(WithoutGil([&] { return Engine::FromModelDir(model_dir, c); }));
           }),
           py::arg("model_dir"), py::arg("policy") = "full", py::arg("block_size") = 16,
           py::arg("num_blocks") = 0, py::arg("num_host_blocks") = 0, py::arg("max_batch") = 32,
           py::arg("watermark_blocks") = 0, py::arg("preemption") = "recompute",
           py::arg("num_threads") = 2, py::arg("max_model_len") = 0,
           py::arg("verify_integrity") = false, py::arg("batch_invariant") = true,
           py::arg("allow_nonfinite") = false, py::arg("admission") = "optimistic",
           py::arg("scorer") = "host")
      .def(
          "add_request",
          [](Engine& e, int64_t id, std::vector<int32_t> prompt, int32_t max_new_tokens,
             float temperature, float top_p, uint64_t seed, bool ignore_eos,
             std::vector<int32_t> forced_output, bool return_logits, bool record_evictions) {
            Request r;
            r.id = id;
            r.prompt = std::move(prompt);
            r.sampling.max_new_tokens = max_new_tokens;
            r.sampling.temperature = temperature;
            r.sampling.top_p = top_p;
            r.sampling.seed = seed;
            r.sampling.ignore_eos = ignore_eos;
            r.forced_output = std::move(forced_output);
            r.return_logits = return_logits;
            r.record_evictions = record_evictions;
            Check(WithoutGil([&] { return e.AddRequest(std::move(r)); }));
          },
          py::arg("request_id"), py::arg("prompt_ids"), py::arg("max_new_tokens") = 256,
          py::arg("temperature") = 0.0f, py::arg("top_p") = 1.0f, py::arg("seed") = 0,
          py::arg("ignore_eos") = false, py::arg("forced_output") = std::vector<int32_t>{},
          py::arg("return_logits") = false, py::arg("record_evictions") = false,
          "Queue a request. record_evictions: its result carries 'evicted_at' [layers, kv_heads, "
          "positions] (the step that evicted each position from each head, NEVER_EVICTED if "
          "none) and 'first_eviction_step'.")
      .def(
          "run",
          [](Engine& e) {
            std::vector<RequestOutput> v = Unwrap(WithoutGil([&] { return e.RunToCompletion(); }));
            py::list result;
            for (RequestOutput& o : v)
              result.append(ToDict(std::move(o), e.model_config().vocab_size));
            return result;
          },
          "Run every queued request to completion; returns their results in finishing order.")
      .def(
          "step",
          [](Engine& e) {
            std::vector<RequestOutput> done;
            Check(WithoutGil([&] { return e.Step(&done); }));
            py::list result;
            for (RequestOutput& o : done)
              result.append(ToDict(std::move(o), e.model_config().vocab_size));
            return result;
          },
          "One scheduler step; returns the requests that finished in it.")
      .def(
          "replay_evictions",
          [](Engine& e, std::vector<int32_t> token_ids, int32_t prompt_len, py::object policy) {
            const PolicyConfig config = PolicyConfigFromPython(policy);
            EvictionRecord r = Unwrap(
                WithoutGil([&] { return e.ReplayEvictions(token_ids, prompt_len, config); }));
            return EvictionsToPython(r);
          },
          py::arg("token_ids"), py::arg("prompt_len"), py::arg("policy"),
          "Teacher-force token_ids (the first prompt_len the prompt) through the engine alone "
          "under `policy` (a name or config); returns (evicted_at [layers, kv_heads, "
          "len(token_ids)] int64, first eviction step): the decode step after which the policy "
          "evicted each position from each head, NEVER_EVICTED if never. The engine must be "
          "idle.")
      .def_property_readonly(
          "has_unfinished",
          [](const Engine& e) { return WithoutGil([&] { return e.HasUnfinished(); }); })
      .def_property_readonly(
          "num_running",
          [](const Engine& e) { return WithoutGil([&] { return e.num_running(); }); },
          "Sequences running after the last step (the running batch).")
      .def("stats_json",
           [](const Engine& e) { return WithoutGil([&] { return e.stats(); }).ToJson(); })
      .def_property_readonly("num_free_blocks",
                             [](const Engine& e) { return e.block_manager().NumFreeBlocks(); })
      .def_property_readonly("num_usable_blocks",
                             [](const Engine& e) { return e.block_manager().NumUsableBlocks(); })
      .def_property_readonly(
          "num_kv_heads_total",
          [](const Engine& e) { return e.block_manager().shape().num_heads_total(); })
      .def_property_readonly("vocab_size",
                             [](const Engine& e) { return e.model_config().vocab_size; })
      .def("verify_integrity", [](const Engine& e) {
        Check(WithoutGil([&] { return e.block_manager().VerifyIntegrity(); }));
      });
}

}  // namespace beaconkv
