#include "kernels/cuda_kv_store.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <functional>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/cache_ops.h"

namespace beaconkv::kernels {
namespace {

void CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  const std::string msg =
      std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  ::beaconkv::internal::CheckFailed(__FILE__, __LINE__, "CUDA call", msg.c_str());
}

}  // namespace

CudaKvStore::CudaKvStore(void* keys, void* values, int32_t* positions, int32_t num_blocks,
                         int32_t block_size, int32_t head_dim, KvDtype dtype, cudaStream_t stream)
    : keys_(keys),
      values_(values),
      positions_(positions),
      num_blocks_(num_blocks),
      block_size_(block_size),
      head_dim_(head_dim),
      dtype_(dtype),
      elem_bytes_(KvDtypeBytes(dtype)),
      stream_(stream) {
  BKV_CHECK(keys != nullptr && values != nullptr && positions != nullptr);
  BKV_CHECK(num_blocks >= 1 && block_size >= 1 && head_dim >= 1);
  BKV_CHECK(ValidKvDtype(dtype));
}

void CudaKvStore::ToHostFloats(const void* src, int64_t elems, float* dst, const char* what) {
  if (dtype_ == KvDtype::kFloat32) {
    CudaCheck(cudaMemcpyAsync(dst, src, elems * sizeof(float), cudaMemcpyDeviceToHost, stream_),
              what);
    return;
  }
  bits_.resize(elems);
  CudaCheck(
      cudaMemcpyAsync(bits_.data(), src, elems * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_),
      what);
  CudaCheck(cudaStreamSynchronize(stream_), what);
  for (int64_t i = 0; i < elems; ++i) {
    if (dtype_ == KvDtype::kBFloat16) {
      __nv_bfloat16_raw raw;
      raw.x = bits_[i];
      dst[i] = __bfloat162float(__nv_bfloat16(raw));
    } else {
      __half_raw raw;
      raw.x = bits_[i];
      dst[i] = __half2float(__half(raw));
    }
  }
}

void CudaKvStore::FromHostFloats(const float* src, int64_t elems, void* dst, const char* what) {
  if (dtype_ == KvDtype::kFloat32) {
    CudaCheck(cudaMemcpyAsync(dst, src, elems * sizeof(float), cudaMemcpyHostToDevice, stream_),
              what);
    return;
  }
  bits_.resize(elems);
  for (int64_t i = 0; i < elems; ++i) {
    if (dtype_ == KvDtype::kBFloat16) {
      bits_[i] = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(src[i])).x;
    } else {
      bits_[i] = static_cast<__half_raw>(__float2half_rn(src[i])).x;
    }
  }
  CudaCheck(
      cudaMemcpyAsync(dst, bits_.data(), elems * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_),
      what);
  // bits_ is reused by the next call: the copy must be done with it.
  CudaCheck(cudaStreamSynchronize(stream_), what);
}

CudaKvStore::~CudaKvStore() {
  for (int32_t* p : staging_) cudaFree(p);
}

void CudaKvStore::CheckBlock(BlockId b) const { BKV_CHECK(b >= 0 && b < num_blocks_); }

void CudaKvStore::CheckSlot(SlotRef s) const {
  CheckBlock(s.block);
  BKV_CHECK(s.offset >= 0 && s.offset < block_size_);
}

int32_t* CudaKvStore::Stage(const int32_t* host, int64_t n, int which) {
  if (n > staging_size_[which]) {
    cudaFree(staging_[which]);
    staging_[which] = nullptr;
    staging_size_[which] = 0;
    CudaCheck(cudaMalloc(&staging_[which], n * sizeof(int32_t)), "cudaMalloc (staging)");
    staging_size_[which] = n;
  }
  CudaCheck(
      cudaMemcpyAsync(staging_[which], host, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (indexes)");
  return staging_[which];
}

void CudaKvStore::RunIndexed(
    const std::vector<int32_t>& a, const std::vector<int32_t>& b, const char* what,
    const std::function<cudaError_t(const int32_t*, const int32_t*, int32_t)>& launch) {
  const auto n = static_cast<int32_t>(a.size());
  const int32_t* da = Stage(a.data(), n, 0);
  const int32_t* db = Stage(b.data(), n, 1);
  CudaCheck(launch(da, db, n), what);
  // The host vectors must outlive the staging copies, and callers reuse slots at once.
  CudaCheck(cudaStreamSynchronize(stream_), what);
}

void CudaKvStore::CopyBlocks(absl::Span<const BlockCopy> copies) {
  if (copies.empty()) return;
  std::vector<int32_t> src, dst;
  src.reserve(copies.size());
  dst.reserve(copies.size());
  for (const BlockCopy& c : copies) {
    CheckBlock(c.src);
    CheckBlock(c.dst);
    src.push_back(c.src);
    dst.push_back(c.dst);
  }
  RunIndexed(src, dst, "CopyBlocks", [&](const int32_t* ds, const int32_t* dd, int32_t n) {
    return kernels::CopyBlocks(ds, dd, n, keys_, values_, dtype_, positions_, block_size_,
                               head_dim_, stream_);
  });
}

void CudaKvStore::MoveSlots(absl::Span<const SlotMove> moves) {
  if (moves.empty()) return;
  std::vector<int32_t> from, to;
  from.reserve(moves.size());
  to.reserve(moves.size());
  for (const SlotMove& m : moves) {
    CheckSlot(m.from);
    CheckSlot(m.to);
    from.push_back(static_cast<int32_t>(Slot(m.from)));
    to.push_back(static_cast<int32_t>(Slot(m.to)));
  }
  RunIndexed(from, to, "MoveSlots", [&](const int32_t* df, const int32_t* dt, int32_t n) {
    return kernels::MoveSlots(df, dt, n, keys_, values_, dtype_, positions_, head_dim_, stream_);
  });
}

void CudaKvStore::SetPosition(SlotRef slot, int32_t position) {
  CheckSlot(slot);
  CudaCheck(cudaMemcpyAsync(positions_ + Slot(slot), &position, sizeof(int32_t),
                            cudaMemcpyHostToDevice, stream_),
            "SetPosition");
  CudaCheck(cudaStreamSynchronize(stream_), "SetPosition (synchronize)");
}

void CudaKvStore::SwapOut(absl::Span<const BlockCopy> copies, CpuKvStore& host) {
  BKV_CHECK(host.block_size() == block_size_ && host.head_dim() == head_dim_);
  const int64_t elems = int64_t{block_size_} * head_dim_;
  std::vector<int32_t> pos(block_size_);
  for (const BlockCopy& c : copies) {
    CheckBlock(c.src);
    BKV_CHECK(c.dst >= 0 && c.dst < host.num_blocks());
    // A block's slots are contiguous in both stores: [block_size, head_dim].
    ToHostFloats(KeyBytes(c.src), elems, host.key({c.dst, 0}), "SwapOut (keys)");
    ToHostFloats(ValueBytes(c.src), elems, host.value({c.dst, 0}), "SwapOut (values)");
    CudaCheck(cudaMemcpyAsync(pos.data(), positions_ + int64_t{c.src} * block_size_,
                              block_size_ * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
              "SwapOut (positions)");
    CudaCheck(cudaStreamSynchronize(stream_), "SwapOut (synchronize)");
    for (int32_t o = 0; o < block_size_; ++o) host.SetPosition({c.dst, o}, pos[o]);
  }
}

void CudaKvStore::SwapIn(absl::Span<const BlockCopy> copies, const CpuKvStore& host) {
  BKV_CHECK(host.block_size() == block_size_ && host.head_dim() == head_dim_);
  const int64_t elems = int64_t{block_size_} * head_dim_;
  std::vector<int32_t> pos(block_size_);
  for (const BlockCopy& c : copies) {
    BKV_CHECK(c.src >= 0 && c.src < host.num_blocks());
    CheckBlock(c.dst);
    for (int32_t o = 0; o < block_size_; ++o) pos[o] = host.position({c.src, o});
    FromHostFloats(host.key({c.src, 0}), elems, KeyBytes(c.dst), "SwapIn (keys)");
    FromHostFloats(host.value({c.src, 0}), elems, ValueBytes(c.dst), "SwapIn (values)");
    CudaCheck(cudaMemcpyAsync(positions_ + int64_t{c.dst} * block_size_, pos.data(),
                              block_size_ * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "SwapIn (positions)");
    CudaCheck(cudaStreamSynchronize(stream_), "SwapIn (synchronize)");
  }
}

}  // namespace beaconkv::kernels
