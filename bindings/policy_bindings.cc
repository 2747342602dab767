// Python view of the eviction policies: one config class per policy (every knob a field),
// a stateful per-sequence `Policy`, and `run_policy` to run any policy once on NumPy arrays
// of one head. Status errors become ValueError with the C++ message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bindings/status_cast.h"
#include "core/policy.h"
#include "core/rope.h"

namespace py = pybind11;

namespace beaconkv {
namespace {

using py_util::Check;
using py_util::Unwrap;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

std::string PoolingToString(Pooling p) {
  return p == Pooling::kMax ? "max" : p == Pooling::kAvg ? "avg" : "none";
}
Pooling PoolingFromString(const std::string& s) {
  if (s == "max") return Pooling::kMax;
  if (s == "avg") return Pooling::kAvg;
  if (s == "none") return Pooling::kNone;
  throw py::value_error(absl::StrFormat("pooling must be 'max', 'avg' or 'none', got '%s'", s));
}
BudgetMode BudgetModeFromString(const std::string& s) { return Unwrap(ParseBudgetMode(s)); }

PolicyConfig ToConfig(py::handle obj) {
  if (py::isinstance<py::str>(obj)) return Unwrap(DefaultPolicyConfig(obj.cast<std::string>()));
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

// Applies keyword overrides by attribute name; an unknown name is a ValueError.
py::object WithOverrides(py::object config, const py::kwargs& kwargs) {
  for (auto item : kwargs) {
    const std::string key = item.first.cast<std::string>();
    if (!py::hasattr(config, key.c_str()) || key.rfind("_", 0) == 0) {
      throw py::value_error(
          absl::StrFormat("%s has no knob '%s'",
                          py::str(py::type::of(config).attr("__name__")).cast<std::string>(), key));
    }
    try {
      config.attr(key.c_str()) = item.second;
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      // pybind11's message lists C++ signatures; say which knob and what it takes instead.
      const py::object current = config.attr(key.c_str());
      throw py::value_error(
          absl::StrFormat("%s knob '%s' = %s: expected %s (as its current value %s)",
                          py::str(py::type::of(config).attr("__name__")).cast<std::string>(), key,
                          py::repr(item.second).cast<std::string>(),
                          py::str(py::type::of(current).attr("__name__")).cast<std::string>(),
                          py::repr(current).cast<std::string>()));
    }
  }
  return config;
}

py::dict ConfigDict(py::handle self) {
  py::dict d;
  for (auto name : self.attr("_fields")) {
    d[name] = self.attr(name.cast<std::string>().c_str());
  }
  return d;
}

std::string ConfigRepr(py::handle self) {
  std::vector<std::string> parts;
  for (auto name : self.attr("_fields")) {
    const std::string n = name.cast<std::string>();
    parts.push_back(absl::StrCat(n, "=", py::repr(self.attr(n.c_str())).cast<std::string>()));
  }
  return absl::StrCat(py::str(py::type::of(self).attr("__name__")).cast<std::string>(), "(",
                      absl::StrJoin(parts, ", "), ")");
}

// Shared: fields tuple, kwargs constructor, repr, to_dict, equality by fields.
template <typename T>
py::class_<T> BindConfig(py::module_& m, const char* name, const char* doc,
                         std::vector<const char*> fields) {
  py::class_<T> cls(m, name, doc);
  py::tuple f(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) f[i] = py::str(fields[i]);
  cls.attr("_fields") = f;
  cls.def(py::init([](const py::kwargs& kwargs) {
            py::object obj = py::cast(T{});
            WithOverrides(obj, kwargs);
            return obj.cast<T>();
          }),
          "Keyword arguments set knobs; every knob not given keeps its default.")
      .def("__repr__", [](py::handle self) { return ConfigRepr(self); })
      .def("to_dict", [](py::handle self) { return ConfigDict(self); })
      .def(
          "validate", [](const T& self) { Check(ValidatePolicyConfig(PolicyConfig(self))); },
          "Raises ValueError if the configuration cannot work.")
      .def_property_readonly(
          "name", [](const T& self) { return std::string(PolicyName(PolicyConfig(self))); })
      .def("__eq__", [](py::handle a, py::handle b) {
        if (!py::type::of(a).is(py::type::of(b))) return false;
        return ConfigDict(a).equal(ConfigDict(b));
      });
  return cls;
}

FloatArray CheckedFloat(py::handle obj, const char* what, std::vector<py::ssize_t> shape) {
  FloatArray a = FloatArray::ensure(obj);
  if (!a) throw py::value_error(absl::StrFormat("%s must be a float array", what));
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(i) == shape[i];
  if (!ok) {
    std::vector<std::string> want, got;
    for (auto s : shape) want.push_back(s < 0 ? "*" : absl::StrCat(s));
    for (py::ssize_t i = 0; i < a.ndim(); ++i) got.push_back(absl::StrCat(a.shape(i)));
    throw py::value_error(absl::StrFormat("%s must have shape [%s], got [%s]", what,
                                          absl::StrJoin(want, ", "), absl::StrJoin(got, ", ")));
  }
  return a;
}

IntArray CheckedInt(py::handle obj, const char* what, py::ssize_t n) {
  IntArray a = IntArray::ensure(obj);
  if (!a || a.ndim() != 1 || a.shape(0) != n) {
    throw py::value_error(absl::StrFormat("%s must be a 1-D integer array of length %d", what, n));
  }
  return a;
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
  py::object cfg_obj = FromConfig(ToConfig(policy));
  if (!py::isinstance<py::str>(policy)) cfg_obj = py::type::of(cfg_obj)(**ConfigDict(policy));
  WithOverrides(cfg_obj, overrides);
  const PolicyConfig config = ToConfig(cfg_obj);
  FloatArray keys = CheckedFloat(keys_obj, "keys", {-1, -1});
  const int32_t n = static_cast<int32_t>(keys.shape(0));
  const int32_t d = static_cast<int32_t>(keys.shape(1));
  IntArray positions = CheckedInt(positions_obj, "positions", n);
  FloatArray pre, post;
  IntArray qpos;
  int32_t steps = 0, group = 1;
  if (!queries_post.is_none() || !queries_pre.is_none()) {
    if (queries_post.is_none()) queries_post = queries_pre;
    if (queries_pre.is_none()) queries_pre = queries_post;
    post = CheckedFloat(queries_post, "queries_post", {-1, -1, d});
    steps = static_cast<int32_t>(post.shape(0));
    group = static_cast<int32_t>(post.shape(1));
    pre = CheckedFloat(queries_pre, "queries_pre", {steps, group, d});
    if (query_positions.is_none()) {
      // Default: the newest `steps` positions end at the newest key.
      int32_t last = -1;
      for (int32_t i = 0; i < n; ++i) last = std::max(last, positions.data()[i]);
      IntArray qp(steps);
      for (int32_t s = 0; s < steps; ++s) qp.mutable_data()[s] = last - steps + 1 + s;
      qpos = qp;
    } else {
      qpos = CheckedInt(query_positions, "query_positions", steps);
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
    FloatArray pre = CheckedFloat(pre_obj, "queries_pre", {g, d});
    FloatArray post = CheckedFloat(post_obj, "queries_post", {g, d});
    FloatArray keys;
    IntArray pos;
    HeadKeys head;
    const bool with_keys = !keys_obj.is_none();
    if (with_keys) {
      keys = CheckedFloat(keys_obj, "keys", {-1, d});
      pos = CheckedInt(positions_obj, "positions", keys.shape(0));
      head = {keys.data(), pos.data(), static_cast<int32_t>(keys.shape(0))};
    }
    Check(Locked([&] {
      return state_->Observe(layer, kv_head, {position, pre.data(), post.data()},
                             with_keys ? &head : nullptr);
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
      keys.push_back(CheckedFloat(keys_list[h], "keys[h]", {-1, d}));
      pos.push_back(CheckedInt(positions_list[h], "positions[h]", keys.back().shape(0)));
      heads.push_back(
          {keys.back().data(), pos.back().data(), static_cast<int32_t>(keys.back().shape(0))});
    }
    std::vector<HeadKeepSet> out =
        Unwrap(Locked([&] { return state_->Compress(layer, heads, due, current_position); }));
    py::list result;
    for (const HeadKeepSet& k : out) {
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

  BindConfig<FullConfig>(m, "FullConfig", "No eviction.", {});
  BindConfig<StreamingConfig>(m, "StreamingConfig", "StreamingLLM: sinks + newest tokens.",
                              {"budget", "n_sinks", "interval"})
      .def_readwrite("budget", &StreamingConfig::budget)
      .def_readwrite("n_sinks", &StreamingConfig::n_sinks)
      .def_readwrite("interval", &StreamingConfig::interval);
  BindConfig<H2OConfig>(m, "H2OConfig", "H2O: accumulated attention + recent window.",
                        {"budget", "recent_fraction", "interval"})
      .def_readwrite("budget", &H2OConfig::budget)
      .def_readwrite("recent_fraction", &H2OConfig::recent_fraction)
      .def_readwrite("interval", &H2OConfig::interval);
  BindConfig<TovaConfig>(m, "TovaConfig", "TOVA: the last query's attention.",
                         {"budget", "interval"})
      .def_readwrite("budget", &TovaConfig::budget)
      .def_readwrite("interval", &TovaConfig::interval);
  BindConfig<SnapKvConfig>(
      m, "SnapKVConfig", "SnapKV, decode-time variant (R-KV codebase).",
      {"budget", "window", "pool_kernel", "pooling", "interval", "budget_mode"})
      .def_readwrite("budget", &SnapKvConfig::budget)
      .def_readwrite("window", &SnapKvConfig::window)
      .def_readwrite("pool_kernel", &SnapKvConfig::pool_kernel)
      .def_property(
          "pooling", [](const SnapKvConfig& c) { return PoolingToString(c.pooling); },
          [](SnapKvConfig& c, const std::string& s) { c.pooling = PoolingFromString(s); })
      .def_readwrite("interval", &SnapKvConfig::interval)
      .def_property(
          "budget_mode",
          [](const SnapKvConfig& c) { return std::string(BudgetModeName(c.budget_mode)); },
          [](SnapKvConfig& c, const std::string& s) { c.budget_mode = BudgetModeFromString(s); });
  BindConfig<RkvConfig>(
      m, "RKVConfig", "R-KV: lambda * importance - (1 - lambda) * redundancy.",
      {"budget", "window", "pool_kernel", "lambda_", "redundancy_threshold", "interval"})
      .def_readwrite("budget", &RkvConfig::budget)
      .def_readwrite("window", &RkvConfig::window)
      .def_readwrite("pool_kernel", &RkvConfig::pool_kernel)
      .def_readwrite("lambda_", &RkvConfig::lambda)
      .def_readwrite("redundancy_threshold", &RkvConfig::redundancy_threshold)
      .def_readwrite("interval", &RkvConfig::interval);
  BindConfig<RpcConfig>(m, "RPCConfig", "RPC: periodic, ratio-based, one token set per layer.",
                        {"period", "window", "ratio", "pool_kernel", "pooling"})
      .def_readwrite("period", &RpcConfig::period)
      .def_readwrite("window", &RpcConfig::window)
      .def_readwrite("ratio", &RpcConfig::ratio)
      .def_readwrite("pool_kernel", &RpcConfig::pool_kernel)
      .def_property(
          "pooling", [](const RpcConfig& c) { return PoolingToString(c.pooling); },
          [](RpcConfig& c, const std::string& s) { c.pooling = PoolingFromString(s); });
  BindConfig<BeaconConfig>(
      m, "BeaconConfig", "BeaconKV (DESIGN.md section 3).",
      {"budget", "interval", "n_recent", "n_beacons", "buffer_max", "buffer_min", "pool_kernel",
       "protect_prompt", "n_sinks", "budget_mode", "coverage_layers"})
      .def_readwrite("budget", &BeaconConfig::budget)
      .def_readwrite("interval", &BeaconConfig::interval)
      .def_readwrite("n_recent", &BeaconConfig::n_recent)
      .def_readwrite("n_beacons", &BeaconConfig::n_beacons)
      .def_readwrite("buffer_max", &BeaconConfig::buffer_max)
      .def_readwrite("buffer_min", &BeaconConfig::buffer_min)
      .def_readwrite("pool_kernel", &BeaconConfig::pool_kernel)
      .def_readwrite("protect_prompt", &BeaconConfig::protect_prompt)
      .def_readwrite("n_sinks", &BeaconConfig::n_sinks)
      .def_readwrite("coverage_layers", &BeaconConfig::coverage_layers)
      .def_property(
          "budget_mode",
          [](const BeaconConfig& c) { return std::string(BudgetModeName(c.budget_mode)); },
          [](BeaconConfig& c, const std::string& s) { c.budget_mode = BudgetModeFromString(s); });

  m.def(
      "policy_config",
      [](const std::string& name, const py::kwargs& kwargs) {
        return WithOverrides(FromConfig(Unwrap(DefaultPolicyConfig(name))), kwargs);
      },
      py::arg("name"),
      "The config object of a policy by name, with keyword overrides; unknown names and "
      "knobs raise ValueError.");
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
        FloatArray x = CheckedFloat(x_obj, "x", {-1, -1});
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
