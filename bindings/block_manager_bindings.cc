// Python view of the block manager with a host KV store attached, so that Python tests
// and tools can write K/V, run every operation and read the bytes back.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "bindings/status_cast.h"
#include "block_manager/block_manager.h"

namespace py = pybind11;

namespace beaconkv {
namespace {

using py_util::Check;
using py_util::Unwrap;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

class PyBlockManager {
 public:
  PyBlockManager(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                 int32_t num_blocks, int32_t num_host_blocks) {
    BlockManagerConfig config;
    config.shape = {num_layers, num_kv_heads, head_dim, block_size};
    config.num_blocks = num_blocks;
    config.num_host_blocks = num_host_blocks;
    Check(BlockManager::ValidateConfig(config));
    store_ = std::make_unique<CpuKvStore>(num_blocks, block_size, head_dim);
    manager_ = Unwrap(BlockManager::Create(config, store_.get()));
  }

  const KvShape& shape() const { return manager_->shape(); }

  void AddSequence(SequenceId id, int32_t prompt_len, py::object keys, py::object values) {
    const KvShape& s = shape();
    FloatArray k, v;
    if (!keys.is_none() || !values.is_none()) {
      k = CheckedArray(keys, "keys", {s.num_layers, s.num_kv_heads, prompt_len, s.head_dim});
      v = CheckedArray(values, "values", {s.num_layers, s.num_kv_heads, prompt_len, s.head_dim});
    }
    Check(manager_->AddSequence(id, prompt_len));
    if (k.size() == 0) return;
    for (int32_t l = 0; l < s.num_layers; ++l)
      for (int32_t h = 0; h < s.num_kv_heads; ++h)
        for (int32_t t = 0; t < prompt_len; ++t) {
          const SlotRef slot = Unwrap(manager_->Slot(id, l, h, t));
          std::copy_n(k.data(l, h, t, 0), s.head_dim, store_->key(slot));
          std::copy_n(v.data(l, h, t, 0), s.head_dim, store_->value(slot));
        }
  }

  void AppendToken(SequenceId id, py::object keys, py::object values) {
    const KvShape& s = shape();
    FloatArray k, v;
    if (!keys.is_none() || !values.is_none()) {
      k = CheckedArray(keys, "keys", {s.num_layers, s.num_kv_heads, s.head_dim});
      v = CheckedArray(values, "values", {s.num_layers, s.num_kv_heads, s.head_dim});
    }
    std::vector<SlotRef> slots(s.num_heads_total());
    Check(manager_->AppendToken(id, absl::MakeSpan(slots)));
    if (k.size() == 0) return;
    for (int32_t l = 0; l < s.num_layers; ++l)
      for (int32_t h = 0; h < s.num_kv_heads; ++h) {
        const SlotRef slot = slots[s.HeadIndex(l, h)];
        std::copy_n(k.data(l, h, 0), s.head_dim, store_->key(slot));
        std::copy_n(v.data(l, h, 0), s.head_dim, store_->value(slot));
      }
  }

  py::dict ApplyKeepSets(SequenceId id,
                         const std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>>& keep) {
    std::vector<KeepSet> sets;
    for (const auto& [head, slots] : keep) sets.push_back({head.first, head.second, slots});
    CompactionPlan plan;
    {
      py::gil_scoped_release release;
      plan = Unwrap(manager_->ApplyKeepSets(id, sets));
    }
    py::dict out;
    out["tokens_evicted"] = plan.tokens_evicted;
    out["blocks_freed"] = plan.blocks_freed;
    out["blocks_released"] = plan.blocks_released;
    out["slots_moved"] = plan.moves.size();
    out["blocks_copied"] = plan.copies.size();
    return out;
  }

  py::tuple ReadHead(SequenceId id, int32_t layer, int32_t kv_head) const {
    const int32_t n = Unwrap(manager_->RetainedTokens(id, layer, kv_head));
    if (Unwrap(manager_->IsSwappedOut(id))) {
      throw py::value_error(absl::StrFormat("sequence %d is swapped out", id));
    }
    const int32_t d = shape().head_dim;
    FloatArray k({n, d}), v({n, d});
    py::array_t<int32_t> pos(n);
    for (int32_t t = 0; t < n; ++t) {
      const SlotRef slot = Unwrap(manager_->Slot(id, layer, kv_head, t));
      std::copy_n(store_->key(slot), d, k.mutable_data(t, 0));
      std::copy_n(store_->value(slot), d, v.mutable_data(t, 0));
      pos.mutable_at(t) = store_->position(slot);
    }
    return py::make_tuple(k, v, pos);
  }

  BlockManager& manager() { return *manager_; }

 private:
  FloatArray CheckedArray(py::object obj, const char* name, std::vector<py::ssize_t> shape) {
    if (obj.is_none())
      throw py::value_error(absl::StrFormat("%s is required with the other", name));
    FloatArray a = FloatArray::ensure(obj);
    if (!a) throw py::value_error(absl::StrFormat("%s must be a float array", name));
    bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = a.shape(i) == shape[i];
    if (!ok) {
      std::string want, got;
      for (auto d : shape) want += absl::StrFormat("%d,", d);
      for (py::ssize_t i = 0; i < a.ndim(); ++i) got += absl::StrFormat("%d,", a.shape(i));
      throw py::value_error(absl::StrFormat("%s has shape (%s), expected (%s)", name, got, want));
    }
    return a;
  }

  std::unique_ptr<CpuKvStore> store_;
  std::unique_ptr<BlockManager> manager_;
};

}  // namespace

void BindBlockManager(py::module_& m) {
  using PBM = PyBlockManager;
  py::class_<PBM>(m, "BlockManager", "Head-granular paged KV cache over a host KV store (float32).")
      .def(py::init<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t>(), py::arg("num_layers"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("block_size") = 16,
           py::arg("num_blocks") = 1024, py::arg("num_host_blocks") = 0)
      .def_property_readonly("num_layers", [](const PBM& b) { return b.shape().num_layers; })
      .def_property_readonly("num_kv_heads", [](const PBM& b) { return b.shape().num_kv_heads; })
      .def_property_readonly("head_dim", [](const PBM& b) { return b.shape().head_dim; })
      .def_property_readonly("block_size", [](const PBM& b) { return b.shape().block_size; })
      .def("add_sequence", &PBM::AddSequence, py::arg("seq_id"), py::arg("prompt_len"),
           py::arg("keys") = py::none(), py::arg("values") = py::none(),
           "Allocate a sequence; keys/values [num_layers, num_kv_heads, prompt_len, head_dim].")
      .def("append_token", &PBM::AppendToken, py::arg("seq_id"), py::arg("keys") = py::none(),
           py::arg("values") = py::none(),
           "Append one token to every head; keys/values [num_layers, num_kv_heads, head_dim].")
      .def(
          "fork", [](PBM& b, SequenceId p, SequenceId c) { Check(b.manager().Fork(p, c)); },
          py::arg("parent"), py::arg("child"))
      .def(
          "free", [](PBM& b, SequenceId id) { Check(b.manager().FreeSequence(id)); },
          py::arg("seq_id"))
      .def(
          "swap_out", [](PBM& b, SequenceId id) { Check(b.manager().SwapOut(id)); },
          py::arg("seq_id"))
      .def(
          "swap_in", [](PBM& b, SequenceId id) { Check(b.manager().SwapIn(id)); },
          py::arg("seq_id"))
      .def("apply_keep_sets", &PBM::ApplyKeepSets, py::arg("seq_id"), py::arg("keep"),
           "keep: {(layer, kv_head): slot indexes to keep}. Returns compaction statistics.")
      .def("read_head", &PBM::ReadHead, py::arg("seq_id"), py::arg("layer"), py::arg("kv_head"),
           "(keys [n, head_dim], values [n, head_dim], positions [n]) of one head, slot order.")
      .def_property_readonly("num_free_blocks", [](PBM& b) { return b.manager().NumFreeBlocks(); })
      .def_property_readonly("num_used_blocks", [](PBM& b) { return b.manager().NumUsedBlocks(); })
      .def_property_readonly("num_free_host_blocks",
                             [](PBM& b) { return b.manager().NumFreeHostBlocks(); })
      .def_property_readonly("usage", [](PBM& b) { return b.manager().Usage(); })
      .def_property_readonly("fragmentation", [](PBM& b) { return b.manager().Fragmentation(); })
      .def_property_readonly("sequence_ids", [](PBM& b) { return b.manager().SequenceIds(); })
      .def("blocks_of", [](PBM& b, SequenceId id) { return Unwrap(b.manager().NumBlocksOf(id)); })
      .def("retained_tokens",
           [](PBM& b, SequenceId id, int32_t l, int32_t h) {
             return Unwrap(b.manager().RetainedTokens(id, l, h));
           })
      .def("block_table",
           [](PBM& b, SequenceId id, int32_t l, int32_t h) {
             auto t = Unwrap(b.manager().BlockTable(id, l, h));
             return std::vector<BlockId>(t.begin(), t.end());
           })
      .def("is_swapped_out",
           [](PBM& b, SequenceId id) { return Unwrap(b.manager().IsSwappedOut(id)); })
      .def(
          "free_list", [](PBM& b) { return b.manager().pool().FreeList(); },
          "Free blocks in the order they will be taken.")
      .def("verify_integrity", [](PBM& b) { Check(b.manager().VerifyIntegrity()); });
}

}  // namespace beaconkv
