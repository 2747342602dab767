// Storage that grows with use up to a bound: per-sequence policy buffers sized by knobs that
// have no upper limit (a query window, a beacon buffer) take memory as a sequence fills them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace beaconkv::internal {

// Makes room in `v` for `more` elements beyond its size: the capacity doubles, but not past
// `cap` elements (a plain insert's growth could reserve up to twice a full buffer).
template <typename T>
void GrowCapped(std::vector<T>* v, size_t more, size_t cap) {
  const size_t need = v->size() + more;
  if (need <= v->capacity()) return;
  v->reserve(std::max(need, std::min(2 * v->capacity(), cap)));
}

}  // namespace beaconkv::internal
