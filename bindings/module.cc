// The `beaconkv._beaconkv` extension module. Each concept binds itself in its own file.
#include <pybind11/pybind11.h>

namespace beaconkv {
void BindBlockManager(pybind11::module_& m);
void BindEngine(pybind11::module_& m);
void BindPolicies(pybind11::module_& m);
void BindVllm(pybind11::module_& m);
}  // namespace beaconkv

PYBIND11_MODULE(_beaconkv, m) {
  m.doc() = "BeaconKV native core: head-granular paged KV cache and eviction policies";
  beaconkv::BindBlockManager(m);
  beaconkv::BindEngine(m);
  beaconkv::BindPolicies(m);
  beaconkv::BindVllm(m);
}
