// Storage that grows with use up to a bound: per-sequence policy buffers sized by knobs that
// have no upper limit (a query window, a beacon buffer) take memory as a sequence fills them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace beaconkv::internal {

// Makes room in `v` for `more` elements beyond its size: the capacity doubles, but not past
// `cap` elements (a plain insert's growth could reserve up to twice a full buffer).
template <typename T, typename A>
void GrowCapped(std::vector<T, A>* v, size_t more, size_t cap) {
  const size_t need = v->size() + more;
  if (need <= v->capacity()) return;
  v->reserve(std::max(need, std::min(2 * v->capacity(), cap)));
}

// Cache-line-aligned storage: arrays streamed with 64-byte loads (a load that straddles two
// lines costs two), and rows written whole with non-temporal stores.
template <class T>
struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <class U>
  explicit CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  friend bool operator==(const CacheAligned&, const CacheAligned&) { return true; }
};

// The same, but a resize leaves new elements default-initialised (no zero fill): for rows
// written whole right after the resize.
template <class T>
struct CacheAlignedRows : CacheAligned<T> {
  using value_type = T;
  CacheAlignedRows() = default;
  template <class U>
  explicit CacheAlignedRows(const CacheAlignedRows<U>&) {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const CacheAlignedRows&, const CacheAlignedRows&) { return true; }
};

}  // namespace beaconkv::internal
