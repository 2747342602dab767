#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace beaconkv {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

// A read-only private mapping of a whole regular file of at least one byte.
class SafetensorsFile::Mapping {
 public:
  Mapping(const void* data, size_t size) : data_(data), size_(size) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { munmap(const_cast<void*>(data_), size_); }

  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  const void* data_;  // [size_] bytes
  size_t size_;
};

namespace {

using nlohmann::json;

constexpr int64_t kLengthPrefixBytes = 8;

absl::Status HeaderError(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, message));
}

absl::Status TensorError(const std::string& path, const std::string& tensor,
                         const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: tensor '%s': %s", path, tensor, message));
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(absl::StrFormat(
      "field 'dtype' is \"%s\", which is not supported (expected F32, F16 or BF16)", name));
}

// A JSON integer in [0, INT64_MAX], or an error naming `field`.
absl::StatusOr<int64_t> NonNegativeInt(const json& v, const std::string& field) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("field '%s' value %s is too large", field, v.dump()));
    }
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) {  // signed, so negative
    return absl::InvalidArgumentError(
        absl::StrFormat("field '%s' value %s is negative", field, v.dump()));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "field '%s' must hold non-negative integers, got %s %s", field, v.type_name(), v.dump()));
}

// Validates one header entry against a data section of `data_size` bytes.
absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const json& entry,
                                      int64_t data_size) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("entry must be a JSON object, got %s", entry.type_name()));
  }
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return absl::InvalidArgumentError("field 'dtype' is missing");
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("field 'dtype' must be a string, got %s", dtype_it->dump()));
  }
  BKV_ASSIGN_OR_RETURN(DType dtype, ParseDType(dtype_it->get<std::string>()));
  info.dtype = dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return absl::InvalidArgumentError("field 'shape' is missing");
  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("field 'shape' must be a list, got %s", shape_it->dump()));
  }
  int64_t numel = 1;
  for (const json& dim : *shape_it) {
    BKV_ASSIGN_OR_RETURN(int64_t d, NonNegativeInt(dim, "shape"));
    info.shape.push_back(d);
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "field 'shape' %s has more elements than fit in int64", shape_it->dump()));
    }
  }
  int64_t num_bytes = 0;
  if (__builtin_mul_overflow(numel, DTypeSize(info.dtype), &num_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "field 'shape' %s is too large: its byte size overflows int64", shape_it->dump()));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) {
    return absl::InvalidArgumentError("field 'data_offsets' is missing");
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "field 'data_offsets' must be a list [begin, end], got %s", offsets_it->dump()));
  }
  BKV_ASSIGN_OR_RETURN(int64_t begin, NonNegativeInt((*offsets_it)[0], "data_offsets"));
  BKV_ASSIGN_OR_RETURN(int64_t end, NonNegativeInt((*offsets_it)[1], "data_offsets"));
  if (begin > end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("field 'data_offsets' [%d, %d] has begin > end", begin, end));
  }
  if (end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("field 'data_offsets' [%d, %d] runs past the data section of %d bytes "
                        "(truncated file?)",
                        begin, end, data_size));
  }
  if (end - begin != num_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "field 'data_offsets' [%d, %d] spans %d bytes, but shape %s of %s needs %d bytes", begin,
        end, end - begin, ShapeString(info.shape), DTypeName(info.dtype), num_bytes));
  }
  info.data_begin = begin;
  info.data_end = end;
  return info;
}

absl::Status ErrnoError(const std::string& path, const char* what) {
  const int err = errno;
  std::string message = absl::StrFormat("%s: %s: %s", path, what, std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  BKV_CHECK_MSG(false, "unknown DType");
}

int64_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated by ParseHeader not to overflow
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

absl::StatusOr<std::vector<TensorInfo>> SafetensorsFile::ParseHeader(std::string_view file_bytes,
                                                                     const std::string& path,
                                                                     int64_t* data_section_offset) {
  const int64_t file_size = static_cast<int64_t>(file_bytes.size());
  if (file_size < kLengthPrefixBytes) {
    return HeaderError(path, absl::StrFormat("file is %d bytes, shorter than the 8-byte header "
                                             "length (truncated or not a safetensors file)",
                                             file_size));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<unsigned char>(file_bytes[i]);
  }
  if (header_len > static_cast<uint64_t>(file_size - kLengthPrefixBytes)) {
    return HeaderError(path, absl::StrFormat("header length %d exceeds the %d bytes that follow "
                                             "the length prefix (truncated or not a safetensors "
                                             "file)",
                                             header_len, file_size - kLengthPrefixBytes));
  }
  const int64_t data_offset = kLengthPrefixBytes + static_cast<int64_t>(header_len);
  const int64_t data_size = file_size - data_offset;
  const std::string_view header_text = file_bytes.substr(kLengthPrefixBytes, header_len);

  json header;
  // A JSON object keeps the last of duplicate keys; a header naming a tensor twice is
  // ambiguous, so the parser records the first top-level key seen twice.
  absl::flat_hash_set<std::string> keys;
  std::string duplicate;
  bool has_duplicate = false;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !has_duplicate &&
        !keys.insert(parsed.get<std::string>()).second) {
      has_duplicate = true;
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    header = json::parse(header_text.begin(), header_text.end(), on_event);
  } catch (const json::exception& e) {
    return HeaderError(path, absl::StrFormat("header is not valid JSON: %s", e.what()));
  }
  if (has_duplicate) {
    return HeaderError(path, absl::StrFormat("header names '%s' twice", duplicate));
  }
  if (!header.is_object()) {
    return HeaderError(path,
                       absl::StrFormat("header must be a JSON object, got %s", header.type_name()));
  }

  std::vector<TensorInfo> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return HeaderError(path, absl::StrFormat("field '__metadata__' must be an object, got %s",
                                                 entry.type_name()));
      }
      continue;
    }
    absl::StatusOr<TensorInfo> info = ParseEntry(name, entry, data_size);
    if (!info.ok()) return TensorError(path, name, std::string(info.status().message()));
    tensors.push_back(*std::move(info));
  }
  // Two tensors may not share bytes: writing one would change the other.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors)
    if (t.data_end > t.data_begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (b.data_begin < a.data_end) {
      return HeaderError(
          path,
          absl::StrFormat("tensors '%s' (bytes [%d, %d)) and '%s' (bytes [%d, %d)) overlap", a.name,
                          a.data_begin, a.data_end, b.name, b.data_begin, b.data_end));
    }
  }
  // json objects iterate in key order already; sort anyway so the order is part of the contract.
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  *data_section_offset = data_offset;
  return tensors;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open safetensors file");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError(path, "cannot stat");
    close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("%s: not a regular file", path));
  }
  if (st.st_size < kLengthPrefixBytes) {
    close(fd);
    return HeaderError(path, absl::StrFormat("file is %d bytes, shorter than the 8-byte header "
                                             "length (truncated or not a safetensors file)",
                                             static_cast<int64_t>(st.st_size)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (data == MAP_FAILED) {
    absl::Status s = ErrnoError(path, "cannot mmap");
    close(fd);
    return s;
  }
  close(fd);

  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::make_shared<const Mapping>(data, size);
  BKV_ASSIGN_OR_RETURN(std::vector<TensorInfo> tensors,
                       ParseHeader(file.mapping_->bytes(), path, &file.data_offset_));
  file.tensors_ = std::move(tensors);
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::string_view SafetensorsFile::RawBytes(const std::string& name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) return {};
  return mapping_->bytes().substr(data_offset_ + info->data_begin,
                                  info->data_end - info->data_begin);
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadFloat32(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%s: tensor '%s' is missing (expected shape %s)",
                                               path_, name, ShapeString(expected_shape)));
  }
  if (info->shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor '%s' has shape %s, expected %s",
                                                      path_, name, ShapeString(info->shape),
                                                      ShapeString(expected_shape)));
  }
  const std::string_view bytes = RawBytes(name);
  const int64_t n = info->numel();
  BKV_CHECK(static_cast<int64_t>(bytes.size()) == n * DTypeSize(info->dtype));
  std::vector<float> out(n);
  if (info->dtype == DType::kF32) {
    if (n > 0) std::memcpy(out.data(), bytes.data(), n * sizeof(float));
    return out;
  }
  const bool is_half = info->dtype == DType::kF16;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, sizeof(bits));
    out[i] = is_half ? HalfToFloat(bits) : BFloat16ToFloat(bits);
  }
  return out;
}

}  // namespace beaconkv
