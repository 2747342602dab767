// A validating reader for the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON header, then the data section.
// Every size and offset in the header is checked against the file before it is used, so a
// malformed or truncated file gives an error naming the file and the field or tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace beaconkv {

enum class DType { kF32, kF16, kBF16 };

std::string_view DTypeName(DType dtype);  // the safetensors spelling: "F32", "F16", "BF16"
int64_t DTypeSize(DType dtype);           // bytes per element

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // [rank]; empty for a scalar
  int64_t data_begin = 0;      // byte offsets into the data section, validated:
  int64_t data_end = 0;        // begin <= end <= data size, end - begin == numel * dtype size

  int64_t numel() const;  // product of `shape` (1 for a scalar); validated not to overflow
};

// Formats a shape as "[2, 3]".
std::string ShapeString(const std::vector<int64_t>& shape);

// Half-precision bit patterns to float32; exact for every input (subnormals, inf, NaN).
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates its header. The mapping is shared by copies and lives
  // until the last copy is destroyed.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  bool Has(const std::string& name) const { return index_.contains(name); }
  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(const std::string& name) const;
  // The raw (little-endian) bytes of a tensor; empty when absent.
  std::string_view RawBytes(const std::string& name) const;

  // The tensor converted to float32 (row-major, as stored). NotFound if `name` is absent;
  // InvalidArgument if its shape differs from `expected_shape`. Both errors name the file and
  // the tensor.
  absl::StatusOr<std::vector<float>> ReadFloat32(const std::string& name,
                                                 const std::vector<int64_t>& expected_shape) const;

  // Validates an in-memory image of a safetensors file; `path` only names it in errors.
  // Used by Open (on the mapping) and by tests.
  static absl::StatusOr<std::vector<TensorInfo>> ParseHeader(std::string_view file_bytes,
                                                             const std::string& path,
                                                             int64_t* data_section_offset);

 private:
  class Mapping;

  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;  // the whole file, read-only
  int64_t data_offset_ = 0;                 // 8 + header length: where the data section starts
  std::vector<TensorInfo> tensors_;         // [num_tensors], sorted by name
  absl::flat_hash_map<std::string, size_t> index_;  // name -> position in tensors_
};

}  // namespace beaconkv
