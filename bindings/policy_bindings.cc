// Python view of the eviction policies: one config class per policy (every knob a field),
// a stateful per-sequence `Policy`, and `run_policy` to run any policy once on NumPy arrays
// of one head. Status errors become ValueError with the C++ message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bindings/array_check.h"
#include "bindings/status_cast.h"
#include "core/policy.h"
#include "core/rope.h"
#include "core/scoring.h"
#include "engine/model_policy.h"

namespace py = pybind11;

namespace beaconkv {
namespace {

using py_util::Check;
using py_util::CheckedArray;
using py_util::FloatArray;
using py_util::IntArray;
using py_util::kAnySize;
using py_util::Unwrap;

// A Python knob value -> KnobValue. A str is text the core parses by the knob's type.
KnobValue ToKnobValue(const std::string& knob, py::handle v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) {
    try {
      return v.cast<int64_t>();
    } catch (const py::cast_error&) {
      return py::str(v).cast<std::string>();  // beyond int64: the range check words it
    }
  }
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw py::value_error(absl::StrFormat("knob '%s' = %s: expected a bool, int, float or str", knob,
                                        py::repr(v).cast<std::string>()));
}

py::object FromKnobValue(const KnobValue& v) {
  return std::visit([](const auto& x) { return py::object(py::cast(x)); }, v);
}

py::object KnobBound(const KnobSpec& k, std::optional<double> bound) {
  if (!bound) return py::none();
  if (k.type == KnobType::kInt) return py::int_(static_cast<int64_t>(*bound));
  return py::float_(*bound);
}

// Keyword arguments -> (knob, value) pairs, in the order given.
std::vector<std::pair<std::string, KnobValue>> KnobList(const py::dict& knobs) {
  std::vector<std::pair<std::string, KnobValue>> out;
  for (auto item : knobs) {
    const std::string key = py::str(item.first).cast<std::string>();
    out.emplace_back(key, ToKnobValue(key, item.second));
  }
  return out;
}

// `knobs`: None, a {name: value} mapping, or a sequence of "NAME=VALUE" strings.
std::vector<std::pair<std::string, KnobValue>> KnobsFromPython(py::handle knobs) {
  if (knobs.is_none()) return {};
  if (py::isinstance<py::dict>(knobs)) return KnobList(py::reinterpret_borrow<py::dict>(knobs));
  if (py::isinstance<py::str>(knobs) || !py::isinstance<py::sequence>(knobs)) {
    throw py::type_error("knobs must be a dict or a list of NAME=VALUE strings");
  }
  std::vector<std::pair<std::string, KnobValue>> out;
  for (py::handle item : knobs) {
    auto kv = Unwrap(ParseKnobAssignment(py::str(item).cast<std::string>()));
    out.emplace_back(std::move(kv.first), KnobValue(std::move(kv.second)));
  }
  return out;
}

std::optional<int64_t> OptionalInt(const char* what, py::handle v) {
  if (v.is_none()) return std::nullopt;
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
    throw py::value_error(absl::StrFormat("%s must be an integer or None, got %s", what,
                                          py::repr(v).cast<std::string>()));
  }
  try {
    return v.cast<int64_t>();
  } catch (const py::cast_error&) {
    throw py::value_error(
        absl::StrFormat("%s = %s is out of range", what, py::repr(v).cast<std::string>()));
  }
}

void ApplyKnobs(PolicyConfig& config, const py::dict& knobs) {
  for (const auto& [knob, value] : KnobList(knobs)) Check(SetKnob(config, knob, value));
}

PolicyConfig ToConfig(py::handle obj) {
  if (py::isinstance<py::str>(obj)) {
    const std::string spec = obj.cast<std::string>();
    if (Unwrap(NamesModelPolicy(spec))) {
      throw py::value_error(
          absl::StrFormat("policy '%s' needs the model directory: build it with "
                          "beaconkv.make_policy_config('%s', budget, model=DIR)",
                          spec, spec));
    }
    return Unwrap(BuildPolicyConfig({spec, {}, {}, {}}));
  }
  if (py::isinstance<FullConfig>(obj)) return obj.cast<FullConfig>();
  if (py::isinstance<StreamingConfig>(obj)) return obj.cast<StreamingConfig>();
  if (py::isinstance<H2OConfig>(obj)) return obj.cast<H2OConfig>();
  if (py::isinstance<TovaConfig>(obj)) return obj.cast<TovaConfig>();
  if (py::isinstance<SnapKvConfig>(obj)) return obj.cast<SnapKvConfig>();
  if (py::isinstance<RkvConfig>(obj)) return obj.cast<RkvConfig>();
  if (py::isinstance<RpcConfig>(obj)) return obj.cast<RpcConfig>();
  if (py::isinstance<BeaconConfig>(obj)) return obj.cast<BeaconConfig>();
  throw py::type_error("policy must be a policy name or one of the *Config classes");
}

py::object FromConfig(const PolicyConfig& c) {
  return std::visit([](const auto& cfg) { return py::cast(cfg); }, c);
}

py::dict ConfigDict(const PolicyConfig& config) {
  py::dict d;
  for (const KnobSpec& k : SpecOf(config).knobs) {
    d[py::str(k.name)] = FromKnobValue(Unwrap(GetKnob(config, k.name)));
  }
  return d;
}

// One Python class per config struct; its attributes are the registry's knobs.
template <typename T>
void BindConfig(py::module_& m, const char* name) {
  const PolicySpec& spec = SpecOf(PolicyConfig(T{}));
  py::class_<T> cls(m, name, spec.summary.c_str());
  py::tuple fields(spec.knobs.size());
  for (size_t i = 0; i < spec.knobs.size(); ++i) {
    const std::string knob = spec.knobs[i].name;
    fields[i] = py::str(knob);
    cls.def_property(
        knob.c_str(),
        [knob](const T& self) { return FromKnobValue(Unwrap(GetKnob(PolicyConfig(self), knob))); },
        [knob](T& self, py::handle value) {
          PolicyConfig c(self);
          Check(SetKnob(c, knob, ToKnobValue(knob, value)));
          self = std::get<T>(c);
        },
        spec.knobs[i].help.c_str());
  }
  cls.attr("_fields") = fields;
  cls.def(py::init([](const py::kwargs& kwargs) {
            PolicyConfig c(T{});
            ApplyKnobs(c, kwargs);
            return std::get<T>(c);
          }),
          "Keyword arguments set knobs; every knob not given keeps its default.")
      .def("__repr__",
           [name](const T& self) {
             std::vector<std::string> parts;
             for (auto item : ConfigDict(PolicyConfig(self))) {
               parts.push_back(absl::StrCat(py::str(item.first).cast<std::string>(), "=",
                                            py::repr(item.second).cast<std::string>()));
             }
             return absl::StrCat(name, "(", absl::StrJoin(parts, ", "), ")");
           })
      .def("to_dict", [](const T& self) { return ConfigDict(PolicyConfig(self)); })
      .def(
          "validate", [](const T& self) { Check(ValidatePolicyConfig(PolicyConfig(self))); },
          "Raises ValueError if the configuration cannot work.")
      .def_property_readonly(
          "name", [](const T& self) { return std::string(PolicyName(PolicyConfig(self))); })
      .def("__eq__", [](const T& a, py::handle b) {
        if (!py::isinstance<T>(b)) return false;
        return ConfigDict(PolicyConfig(a)).equal(ConfigDict(PolicyConfig(b.cast<T>())));
      });
}

py::array_t<int32_t> ToArray(const std::vector<int32_t>& v) {
  py::array_t<int32_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

py::array_t<int32_t> RunPolicy(py::object policy, py::handle keys_obj, py::handle positions_obj,
                               int32_t prompt_len, py::object queries_pre, py::object queries_post,
                               py::object query_positions, int32_t current_position,
                               double rope_theta, const py::kwargs& overrides) {
  PolicyConfig config = ToConfig(policy);
  ApplyKnobs(config, overrides);
  FloatArray keys = CheckedArray<float>(keys_obj, "keys", {kAnySize, kAnySize});
  const int32_t n = static_cast<int32_t>(keys.shape(0));
  const int32_t d = static_cast<int32_t>(keys.shape(1));
  IntArray positions = CheckedArray<int32_t>(positions_obj, "positions", {n});
  FloatArray pre, post;
  IntArray qpos;
  int32_t steps = 0, group = 1;
  if (!queries_post.is_none() || !queries_pre.is_none()) {
    if (queries_post.is_none()) queries_post = queries_pre;
    if (queries_pre.is_none()) queries_pre = queries_post;
    post = CheckedArray<float>(queries_post, "queries_post", {kAnySize, kAnySize, d});
    steps = static_cast<int32_t>(post.shape(0));
    group = static_cast<int32_t>(post.shape(1));
    pre = CheckedArray<float>(queries_pre, "queries_pre", {steps, group, d});
    if (query_positions.is_none()) {
      // Default: the newest `steps` positions end at the newest key.
      int32_t last = -1;
      for (int32_t i = 0; i < n; ++i) last = std::max(last, positions.data()[i]);
      IntArray qp(steps);
      for (int32_t s = 0; s < steps; ++s) qp.mutable_data()[s] = last - steps + 1 + s;
      qpos = qp;
    } else {
      qpos = CheckedArray<int32_t>(query_positions, "query_positions", {steps});
    }
  }
  OneHeadInput in;
  in.keys = {keys.data(), positions.data(), n};
  in.prompt_len = prompt_len;
  in.group_size = group;
  in.num_steps = steps;
  in.queries_pre = steps ? pre.data() : nullptr;
  in.queries_post = steps ? post.data() : nullptr;
  in.query_positions = steps ? qpos.data() : nullptr;
  in.current_position = current_position;
  return ToArray(Unwrap(py_util::WithoutGil([&] {
    return RunPolicyOnHead(config, {d, rope_theta}, in);
  })));
}

// A per-sequence policy state, as the engine drives it. Like PyBlockManager, every touch of
// the state runs under `mu_` with the GIL released (Compress is long; a thread waiting for
// `mu_` must not hold the GIL).
class PyPolicy {
 public:
  template <typename F>
  auto Locked(F&& f) -> decltype(f()) {
    return py_util::WithoutGil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return f();
    });
  }

  PyPolicy(py::object policy, int32_t num_layers, int32_t num_kv_heads, int32_t group_size,
           int32_t head_dim, double rope_theta, int32_t prompt_len)
      : geometry_{num_layers, num_kv_heads, group_size, {head_dim, rope_theta}} {
    state_ = Unwrap(NewPolicyState(ToConfig(policy), geometry_, prompt_len));
  }

  void Observe(int32_t layer, int32_t kv_head, int32_t position, py::handle pre_obj,
               py::handle post_obj, py::object keys_obj, py::object positions_obj) {
    const int32_t g = geometry_.group_size, d = geometry_.head_dim();
    FloatArray pre = CheckedArray<float>(pre_obj, "queries_pre", {g, d});
    FloatArray post = CheckedArray<float>(post_obj, "queries_post", {g, d});
    FloatArray keys;
    IntArray pos;
    HeadKeys head;
    const bool with_keys = !keys_obj.is_none();
    if (with_keys) {
      keys = CheckedArray<float>(keys_obj, "keys", {kAnySize, d});
      pos = CheckedArray<int32_t>(positions_obj, "positions", {keys.shape(0)});
      head = {keys.data(), pos.data(), static_cast<int32_t>(keys.shape(0))};
    }
    Check(Locked([&] {
      absl::Status st = state_->Observe(layer, kv_head, {position, pre.data(), post.data()},
                                        with_keys ? &head : nullptr);
      // Heads may be observed in any order, and the state used from another thread next:
      // fence the rows a policy streamed (beacon fences only after a step's last head).
      StreamFence();
      return st;
    }));
  }

  std::vector<int32_t> DueHeads(int32_t layer, std::vector<int32_t> tokens) {
    if (static_cast<int32_t>(tokens.size()) != geometry_.num_kv_heads) {
      throw py::value_error(absl::StrFormat("head_tokens must have num_kv_heads = %d entries",
                                            geometry_.num_kv_heads));
    }
    return Locked([&] { return state_->DueHeads(layer, tokens); });
  }

  py::list Compress(int32_t layer, py::sequence keys_list, py::sequence positions_list,
                    std::vector<int32_t> due, int32_t current_position) {
    const int32_t h_count = geometry_.num_kv_heads, d = geometry_.head_dim();
    if (static_cast<int32_t>(py::len(keys_list)) != h_count ||
        static_cast<int32_t>(py::len(positions_list)) != h_count) {
      throw py::value_error(
          absl::StrFormat("keys and positions must be lists of num_kv_heads = %d arrays", h_count));
    }
    std::vector<FloatArray> keys;
    std::vector<IntArray> pos;
    std::vector<HeadKeys> heads;
    for (int32_t h = 0; h < h_count; ++h) {
      keys.push_back(CheckedArray<float>(keys_list[h], "keys[h]", {kAnySize, d}));
      pos.push_back(
          CheckedArray<int32_t>(positions_list[h], "positions[h]", {keys.back().shape(0)}));
      heads.push_back(
          {keys.back().data(), pos.back().data(), static_cast<int32_t>(keys.back().shape(0))});
    }
    std::vector<KeepSet> out =
        Unwrap(Locked([&] { return state_->Compress(layer, heads, due, current_position); }));
    py::list result;
    for (const KeepSet& k : out) {
      result.append(py::make_tuple(k.layer, k.kv_head, ToArray(k.slots)));
    }
    return result;
  }

  std::string name() const { return std::string(state_->policy_name()); }
  bool needs_keys() const { return state_->NeedsKeysOnObserve(); }
  int64_t state_bytes() {
    return Locked([&] { return state_->StateBytes(); });
  }

 private:
  std::mutex mu_;
  PolicyGeometry geometry_;
  std::unique_ptr<PolicyState> state_;
};

}  // namespace

void BindPolicies(py::module_& m) {
  m.def("policy_names", &PolicyNames, "The eight policy names, in a fixed order.");

  BindConfig<FullConfig>(m, "FullConfig");
  BindConfig<StreamingConfig>(m, "StreamingConfig");
  BindConfig<H2OConfig>(m, "H2OConfig");
  BindConfig<TovaConfig>(m, "TovaConfig");
  BindConfig<SnapKvConfig>(m, "SnapKVConfig");
  BindConfig<RkvConfig>(m, "RKVConfig");
  BindConfig<RpcConfig>(m, "RPCConfig");
  BindConfig<BeaconConfig>(m, "BeaconConfig");

  py::class_<KnobSpec>(m, "KnobSpec", "One knob of a policy, as the core's registry states it.")
      .def_readonly("name", &KnobSpec::name)
      .def_property_readonly("type",
                             [](const KnobSpec& k) { return std::string(KnobTypeName(k.type)); })
      .def_readonly("help", &KnobSpec::help)
      .def_property_readonly("default",
                             [](const KnobSpec& k) { return FromKnobValue(k.default_value); })
      .def_property_readonly(
          "min", [](const KnobSpec& k) { return KnobBound(k, k.min); },
          "inclusive lower bound (int, float), or None")
      .def_property_readonly(
          "max", [](const KnobSpec& k) { return KnobBound(k, k.max); },
          "inclusive upper bound (int, float), or None")
      .def_readonly("choices", &KnobSpec::choices, "the values of a choice knob")
      .def("__repr__", [](const KnobSpec& k) {
        return absl::StrFormat("KnobSpec(%s: %s = %s)", k.name, KnobTypeName(k.type),
                               KnobValueText(k.default_value));
      });
  py::class_<PolicySpec>(m, "PolicySpec", "A policy as the core's registry states it.")
      .def_readonly("name", &PolicySpec::name)
      .def_readonly("summary", &PolicySpec::summary)
      .def_readonly("budgeted", &PolicySpec::budgeted,
                    "takes a budget (rpc: period = ratio x budget); full does not")
      .def_readonly("knobs", &PolicySpec::knobs)
      .def("__repr__",
           [](const PolicySpec& p) { return absl::StrFormat("PolicySpec(%s)", p.name); });
  m.def(
      "policy_specs", [] { return PolicySpecs(); },
      "Every policy of the core's registry, in policy_names() order.");
  m.def(
      "policy_spec", [](const std::string& name) { return *Unwrap(FindPolicySpec(name)); },
      py::arg("name"), "The registry entry of one policy; unknown names raise ValueError.");
  m.def(
      "make_policy_config",
      [](const std::string& spec, py::object budget, py::object interval, py::object knobs,
         std::optional<std::string> model) {
        const PolicyRequest request{spec, OptionalInt("budget", budget),
                                    OptionalInt("interval", interval), KnobsFromPython(knobs)};
        return FromConfig(
            Unwrap(model ? BuildModelPolicyConfig(request, *model) : BuildPolicyConfig(request)));
      },
      py::arg("spec"), py::arg("budget") = py::none(), py::kw_only(),
      py::arg("interval") = py::none(), py::arg("knobs") = py::none(),
      py::arg("model") = py::none(),
      R"doc(The validated config of a policy as every entry point names it.

spec: NAME[-pooled][:KNOB=VALUE,...] ('-pooled' is budget_mode=pooled); the name 'model'
stands for the policy `model` recommends (model_policy_spec), the knobs given on top of its.
budget: KV tokens per head for every budgeted policy (rpc: period = ratio x budget unless a
knob sets the period); full ignores it. interval: sets `interval` where the policy has one.
knobs: a {name: value} dict or a list of "NAME=VALUE" strings, applied before the spec's own.
model: the model directory, read only when the spec names 'model'.
An unknown policy or knob, a bad value, budgets that disagree, or 'model' without a model
policy raise ValueError.)doc");
  m.attr("MODEL_POLICY") = std::string(kModelPolicyName);
  m.def(
      "names_model_policy", [](const std::string& spec) { return Unwrap(NamesModelPolicy(spec)); },
      py::arg("spec"),
      "Whether a policy spec names 'model' (MODEL_POLICY: the policy a model directory "
      "recommends), so that building it needs the model directory.");
  m.def(
      "model_policy_spec",
      [](const std::string& model_dir) -> std::optional<std::string> {
        std::string spec = Unwrap(ModelPolicySpec(model_dir));
        if (spec.empty()) return std::nullopt;
        return spec;
      },
      py::arg("model_dir"),
      "The policy spec a model directory recommends (config.json's 'beaconkv_policy', "
      "checked against the registry), or None when it names none; the policy name 'model' "
      "stands for it. A malformed field raises ValueError naming the file.");
  m.def(
      "policy_budget", [](py::handle policy) { return PolicyBudget(ToConfig(policy)); },
      py::arg("policy"),
      "Tokens a configuration keeps per head (rpc: period / ratio), or None for full.");
  m.def(
      "count_bias_layers", [](py::handle policy) { return CountBiasLayers(ToConfig(policy)); },
      py::arg("policy"),
      "The layers [0, n) whose attention adds the count bias (beacon count_bias); 0 for "
      "every other policy.");
  m.def(
      "prompt_slots_in_effect",
      [](py::handle policy) { return PromptSlotsInEffect(ToConfig(policy)); }, py::arg("policy"),
      "Prompt tokens each head outside beacon's coverage layers keeps by score first: "
      "prompt_slots, at most (budget - n_recent - n_sinks) / 8; 0 for every other policy.");
  m.def(
      "policy_config",
      [](const std::string& name, const py::kwargs& kwargs) {
        return FromConfig(Unwrap(BuildPolicyConfig({name, {}, {}, KnobList(kwargs)})));
      },
      py::arg("name"),
      "The validated config of a policy by name (or spec), with keyword knob overrides; "
      "unknown names and knobs raise ValueError.");
  m.def(
      "round_to_bf16",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        py::array_t<float> out(x.request().shape);
        const float* in = x.data();
        float* o = out.mutable_data();
        for (py::ssize_t i = 0; i < x.size(); ++i) o[i] = RoundToBf16(in[i]);
        return out;
      },
      py::arg("x"),
      "Each element rounded to the nearest bfloat16 (ties to even), as float32: what beacon's "
      "score_bf16 does to queries and keys before the products.");
  m.def(
      "describe_policy",
      [](py::object policy) {
        const PolicyTraits t = DescribePolicy(ToConfig(policy));
        py::dict d;
        d["query_space"] = t.query_space;
        d["gqa_reduction"] = t.gqa_reduction;
        d["pooling"] = t.pooling;
        d["trigger"] = t.trigger;
        return d;
      },
      py::arg("policy"), "Query space, GQA reduction, pooling and trigger of a policy.");
  m.def("run_policy", &RunPolicy, py::arg("policy"), py::arg("keys"), py::arg("positions"),
        py::kw_only(), py::arg("prompt_len") = 0, py::arg("queries_pre") = py::none(),
        py::arg("queries_post") = py::none(), py::arg("query_positions") = py::none(),
        py::arg("current_position") = -1, py::arg("rope_theta") = 1e6,
        R"doc(Runs a policy once on one head and returns the kept slots (ascending int32).

policy: a name from policy_names() or a *Config; extra keyword arguments override knobs.
keys: [n, head_dim] post-RoPE keys in slot order; positions: [n] their token positions.
queries_pre / queries_post: [steps, group_size, head_dim] query history, oldest first
(either may be omitted: the other is used for both). query_positions: [steps], default the
newest positions. A head within its budget keeps everything.)doc");
  m.def(
      "apply_rope",
      [](py::handle x_obj, int64_t position, double rope_theta) {
        FloatArray x = CheckedArray<float>(x_obj, "x", {kAnySize, kAnySize});
        const int32_t d = static_cast<int32_t>(x.shape(1));
        Rope rope = Unwrap(Rope::Create({d, rope_theta}));
        FloatArray out({x.shape(0), x.shape(1)});
        rope.RotateMany(x.data(), x.shape(0), position, out.mutable_data());
        return out;
      },
      py::arg("x"), py::arg("position"), py::arg("rope_theta") = 1e6,
      "RoPE (HF rotate-half layout) of every row of x [n, head_dim] at one position.");

  py::class_<PyPolicy>(m, "Policy", "Per-sequence policy state, driven step by step.")
      .def(py::init<py::object, int32_t, int32_t, int32_t, int32_t, double, int32_t>(),
           py::arg("policy"), py::arg("num_layers"), py::arg("num_kv_heads"), py::arg("group_size"),
           py::arg("head_dim"), py::arg("rope_theta") = 1e6, py::arg("prompt_len") = 0)
      .def_property_readonly("name", &PyPolicy::name)
      .def_property_readonly("needs_keys_on_observe", &PyPolicy::needs_keys)
      .def_property_readonly("state_bytes", &PyPolicy::state_bytes)
      .def("observe", &PyPolicy::Observe, py::arg("layer"), py::arg("kv_head"), py::arg("position"),
           py::arg("queries_pre"), py::arg("queries_post"), py::arg("keys") = py::none(),
           py::arg("positions") = py::none(),
           "Records one step's queries ([group_size, head_dim] each) of one head.")
      .def("due_heads", &PyPolicy::DueHeads, py::arg("layer"), py::arg("head_tokens"))
      .def("compress", &PyPolicy::Compress, py::arg("layer"), py::arg("keys"), py::arg("positions"),
           py::arg("due"), py::arg("current_position"),
           "Returns [(layer, kv_head, kept_slots)] for the compressed heads.");
}

// Shared with engine_bindings.cc: a policy name or *Config object -> PolicyConfig.
PolicyConfig PolicyConfigFromPython(py::handle obj) { return ToConfig(obj); }

}  // namespace beaconkv
