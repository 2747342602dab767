// Python view of the block manager with a host KV store attached, so that Python tests
// and tools can write K/V, run every operation and read the bytes back.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_format.h"
#include "bindings/array_check.h"
#include "bindings/status_cast.h"
#include "block_manager/block_manager.h"
#include "block_manager/memory_check.h"
#include "core/status_macros.h"

namespace py = pybind11;

namespace beaconkv {
namespace {

using py_util::Check;
using py_util::FloatArray;
using py_util::Unwrap;

// Thread safety: every method runs its C++ work (manager calls and the K/V copies into and
// out of the store) under `mu_`, taken with the GIL released, so one Python call is atomic
// with respect to the others and no thread ever waits for `mu_` while holding the GIL.
// Statuses are converted to exceptions after the GIL is re-acquired.
class PyBlockManager {
 public:
  PyBlockManager(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                 int32_t num_blocks, int32_t num_host_blocks) {
    BlockManagerConfig config;
    config.shape = {num_layers, num_kv_heads, head_dim, block_size};
    config.num_blocks = num_blocks;
    config.num_host_blocks = num_host_blocks;
    Check(BlockManager::ValidateConfig(config));
    const int64_t device = CpuKvStoreBytes(num_blocks, block_size, head_dim);
    const int64_t host = CpuKvStoreBytes(num_host_blocks, block_size, head_dim);
    Check(CheckHostMemory(device < 0 || host < 0 ? -1 : device + host,
                          absl::StrFormat("BlockManager of num_blocks=%d + num_host_blocks=%d",
                                          num_blocks, num_host_blocks)));
    store_ = std::make_unique<CpuKvStore>(num_blocks, block_size, head_dim);
    manager_ = Unwrap(BlockManager::Create(config, store_.get()));
  }

  const KvShape& shape() const { return manager_->shape(); }

  // Runs `f` under `mu_` with the GIL released; returns its result with the GIL held again.
  template <typename F>
  auto Locked(F&& f) -> decltype(f()) {
    return py_util::WithoutGil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return f();
    });
  }

  void AddSequence(SequenceId id, int32_t prompt_len, py::object keys, py::object values) {
    const KvShape& s = shape();
    FloatArray k, v;
    if (!keys.is_none() || !values.is_none()) {
      k = CheckedArray(keys, "keys", {s.num_layers, s.num_kv_heads, prompt_len, s.head_dim});
      v = CheckedArray(values, "values", {s.num_layers, s.num_kv_heads, prompt_len, s.head_dim});
    }
    // [num_layers, num_kv_heads, prompt_len, head_dim], or null.
    const float* kp = k.size() != 0 ? k.data() : nullptr;
    const float* vp = v.size() != 0 ? v.data() : nullptr;
    Check(Locked([&]() -> absl::Status {
      BKV_RETURN_IF_ERROR(manager_->AddSequence(id, prompt_len));
      if (kp == nullptr) return absl::OkStatus();
      const int64_t d = s.head_dim;
      for (int32_t h = 0; h < s.num_heads_total(); ++h)
        for (int32_t t = 0; t < prompt_len; ++t) {
          BKV_ASSIGN_OR_RETURN(const SlotRef slot,
                               manager_->Slot(id, h / s.num_kv_heads, h % s.num_kv_heads, t));
          const int64_t at = (static_cast<int64_t>(h) * prompt_len + t) * d;
          std::copy_n(kp + at, d, store_->key(slot));
          std::copy_n(vp + at, d, store_->value(slot));
        }
      return absl::OkStatus();
    }));
  }

  void AppendToken(SequenceId id, py::object keys, py::object values) {
    const KvShape& s = shape();
    FloatArray k, v;
    if (!keys.is_none() || !values.is_none()) {
      k = CheckedArray(keys, "keys", {s.num_layers, s.num_kv_heads, s.head_dim});
      v = CheckedArray(values, "values", {s.num_layers, s.num_kv_heads, s.head_dim});
    }
    // [num_layers, num_kv_heads, head_dim], or null.
    const float* kp = k.size() != 0 ? k.data() : nullptr;
    const float* vp = v.size() != 0 ? v.data() : nullptr;
    Check(Locked([&]() -> absl::Status {
      std::vector<SlotRef> slots(s.num_heads_total());
      BKV_RETURN_IF_ERROR(manager_->AppendToken(id, absl::MakeSpan(slots)));
      if (kp == nullptr) return absl::OkStatus();
      const int64_t d = s.head_dim;
      for (int32_t h = 0; h < s.num_heads_total(); ++h) {
        std::copy_n(kp + h * d, d, store_->key(slots[h]));
        std::copy_n(vp + h * d, d, store_->value(slots[h]));
      }
      return absl::OkStatus();
    }));
  }

  py::dict ApplyKeepSets(SequenceId id,
                         const std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>>& keep) {
    std::vector<KeepSet> sets;
    for (const auto& [head, slots] : keep) sets.push_back({head.first, head.second, slots});
    const CompactionPlan plan = Unwrap(Locked([&] { return manager_->ApplyKeepSets(id, sets); }));
    py::dict out;
    out["tokens_evicted"] = plan.tokens_evicted;
    out["blocks_freed"] = plan.blocks_freed;
    out["blocks_released"] = plan.blocks_released;
    out["slots_moved"] = plan.moves.size();
    out["blocks_copied"] = plan.copies.size();
    return out;
  }

  py::tuple ReadHead(SequenceId id, int32_t layer, int32_t kv_head) {
    const int32_t d = shape().head_dim;
    std::vector<float> k, v;   // [n, head_dim]
    std::vector<int32_t> pos;  // [n]
    Check(Locked([&]() -> absl::Status {
      BKV_ASSIGN_OR_RETURN(int32_t n, manager_->RetainedTokens(id, layer, kv_head));
      BKV_ASSIGN_OR_RETURN(const bool swapped, manager_->IsSwappedOut(id));
      if (swapped)
        return absl::FailedPreconditionError(absl::StrFormat("sequence %d is swapped out", id));
      k.resize(static_cast<size_t>(n) * d);
      v.resize(k.size());
      pos.resize(n);
      for (int32_t t = 0; t < n; ++t) {
        BKV_ASSIGN_OR_RETURN(const SlotRef slot, manager_->Slot(id, layer, kv_head, t));
        std::copy_n(store_->key(slot), d, k.data() + static_cast<size_t>(t) * d);
        std::copy_n(store_->value(slot), d, v.data() + static_cast<size_t>(t) * d);
        pos[t] = store_->position(slot);
      }
      return absl::OkStatus();
    }));
    const py::ssize_t n = static_cast<py::ssize_t>(pos.size());
    FloatArray ka({n, static_cast<py::ssize_t>(d)}), va({n, static_cast<py::ssize_t>(d)});
    py::array_t<int32_t> pa(n);
    std::copy(k.begin(), k.end(), ka.mutable_data());
    std::copy(v.begin(), v.end(), va.mutable_data());
    std::copy(pos.begin(), pos.end(), pa.mutable_data());
    return py::make_tuple(ka, va, pa);
  }

  // Every other call: `f(manager)` returning a Status or StatusOr, converted with the GIL held.
  template <typename F>
  auto Call(F&& f) {
    return Locked([&] { return f(*manager_); });
  }

 private:
  FloatArray CheckedArray(py::object obj, const char* name, std::vector<py_util::Dim> shape) {
    if (obj.is_none())
      throw py::value_error(absl::StrFormat("%s is required with the other", name));
    return py_util::CheckedArray<float>(obj, name, shape);
  }

  std::mutex mu_;  // serializes every call's C++ work, store copies included
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
          "fork",
          [](PBM& b, SequenceId p, SequenceId c) {
            Check(b.Call([&](BlockManager& m) { return m.Fork(p, c); }));
          },
          py::arg("parent"), py::arg("child"))
      .def(
          "free",
          [](PBM& b, SequenceId id) {
            Check(b.Call([&](BlockManager& m) { return m.FreeSequence(id); }));
          },
          py::arg("seq_id"))
      .def(
          "swap_out",
          [](PBM& b, SequenceId id) {
            Check(b.Call([&](BlockManager& m) { return m.SwapOut(id); }));
          },
          py::arg("seq_id"))
      .def(
          "swap_in",
          [](PBM& b, SequenceId id) {
            Check(b.Call([&](BlockManager& m) { return m.SwapIn(id); }));
          },
          py::arg("seq_id"))
      .def("apply_keep_sets", &PBM::ApplyKeepSets, py::arg("seq_id"), py::arg("keep"),
           "keep: {(layer, kv_head): slot indexes to keep}. Returns compaction statistics.")
      .def("read_head", &PBM::ReadHead, py::arg("seq_id"), py::arg("layer"), py::arg("kv_head"),
           "(keys [n, head_dim], values [n, head_dim], positions [n]) of one head, slot order.")
      .def_property_readonly(
          "num_free_blocks",
          [](PBM& b) { return b.Call([](BlockManager& m) { return m.NumFreeBlocks(); }); })
      .def_property_readonly(
          "num_used_blocks",
          [](PBM& b) { return b.Call([](BlockManager& m) { return m.NumUsedBlocks(); }); })
      .def_property_readonly(
          "num_free_host_blocks",
          [](PBM& b) { return b.Call([](BlockManager& m) { return m.NumFreeHostBlocks(); }); })
      .def_property_readonly(
          "usage", [](PBM& b) { return b.Call([](BlockManager& m) { return m.Usage(); }); })
      .def_property_readonly(
          "fragmentation",
          [](PBM& b) { return b.Call([](BlockManager& m) { return m.Fragmentation(); }); })
      .def_property_readonly(
          "sequence_ids",
          [](PBM& b) { return b.Call([](BlockManager& m) { return m.SequenceIds(); }); })
      .def("blocks_of",
           [](PBM& b, SequenceId id) {
             return Unwrap(b.Call([&](BlockManager& m) { return m.NumBlocksOf(id); }));
           })
      .def("retained_tokens",
           [](PBM& b, SequenceId id, int32_t l, int32_t h) {
             return Unwrap(b.Call([&](BlockManager& m) { return m.RetainedTokens(id, l, h); }));
           })
      .def("block_table",
           [](PBM& b, SequenceId id, int32_t l, int32_t h) {
             // Copied under the lock: the span is only valid until the next change.
             return Unwrap(b.Call([&](BlockManager& m) -> absl::StatusOr<std::vector<BlockId>> {
               BKV_ASSIGN_OR_RETURN(absl::Span<const BlockId> t, m.BlockTable(id, l, h));
               return std::vector<BlockId>(t.begin(), t.end());
             }));
           })
      .def("is_swapped_out",
           [](PBM& b, SequenceId id) {
             return Unwrap(b.Call([&](BlockManager& m) { return m.IsSwappedOut(id); }));
           })
      .def(
          "free_list", [](PBM& b) { return b.Call([](BlockManager& m) { return m.FreeList(); }); },
          "Free blocks in the order they will be taken.")
      .def("verify_integrity",
           [](PBM& b) { Check(b.Call([](BlockManager& m) { return m.VerifyIntegrity(); })); });
}

}  // namespace beaconkv
