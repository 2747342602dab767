// The safetensors reader: exact F32/F16/BF16 round trips through files written here, and a
// Status naming the file and the field or tensor for every malformed header.
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/engine_test_files.h"

namespace beaconkv {
namespace {

using test_files::Le64;
using test_files::TempRoot;

using ::testing::AllOf;
using ::testing::HasSubstr;

template <class T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Length prefix + header text + data section.
std::string Assemble(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

struct Tensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16" or anything else
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};

// A well-formed file holding `tensors` back to back, in the given order.
std::string BuildFile(const std::vector<Tensor>& tensors) {
  std::vector<std::string> entries = {R"("__metadata__":{"format":"pt"})"};
  std::string data;
  for (const Tensor& t : tensors) {
    entries.push_back(absl::StrFormat(R"("%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]})",
                                      t.name, t.dtype, absl::StrJoin(t.shape, ","), data.size(),
                                      data.size() + t.data.size()));
    data += t.data;
  }
  return Assemble(absl::StrCat("{", absl::StrJoin(entries, ","), "}"), data);
}

std::string TempPath(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = absl::StrCat(info->test_suite_name(), "_", info->name());
  for (char& c : test) {
    if (c == '/') c = '_';
  }
  return absl::StrCat(TempRoot(), "/bkv_", test, "_", name);
}

std::string WriteTemp(const std::string& contents, const std::string& name = "t.safetensors") {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  EXPECT_TRUE(out.good()) << path;
  return path;
}

void ExpectBitwiseEqual(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

TEST(SafetensorsTest, RoundTripsF32F16Bf16Exactly) {
  const std::vector<float> f32 = {1.5f,  -0.25f, 3.0e-5f, 1e30f,
                                  -0.0f, 0.1f,   7.0f,    -1e-40f /* subnormal */};
  // F16 bit patterns and their exact values: normals, subnormals, max, signed zero, infinity.
  const std::vector<uint16_t> f16_bits = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001,
                                          0x03FF, 0x8000, 0x7C00, 0xFC00, 0x3555};
  const std::vector<float> f16_values = {1.0f,
                                         -2.0f,
                                         0.5f,
                                         65504.0f,
                                         std::ldexp(1.0f, -24),
                                         std::ldexp(1023.0f, -24),
                                         -0.0f,
                                         INFINITY,
                                         -INFINITY,
                                         std::ldexp(1365.0f, -12) /* 0x3555 = 1.3330078125/4 */};
  // BF16 is the top half of a float32.
  const std::vector<float> bf16_values = {1.0f, -3.5f, 0.15625f, 3.3895314e38f, 1e-39f, 256.0f};
  std::vector<uint16_t> bf16_bits;
  std::vector<float> bf16_exact;
  for (float v : bf16_values) {
    bf16_bits.push_back(static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16));
    bf16_exact.push_back(std::bit_cast<float>(std::bit_cast<uint32_t>(v) & 0xffff0000u));
  }
  const std::string path = WriteTemp(BuildFile({
      {"w.f32", "F32", {2, 4}, Bytes(f32)},
      {"a.f16", "F16", {10}, Bytes(f16_bits)},
      {"m.bf16", "BF16", {3, 1, 2}, Bytes(bf16_bits)},
      {"scalar", "F32", {}, Bytes(std::vector<float>{42.0f})},
      {"empty", "BF16", {0, 3}, ""},
  }));

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path(), path);
  ASSERT_EQ(file->tensors().size(), 5u);
  // Sorted by name.
  EXPECT_EQ(file->tensors()[0].name, "a.f16");
  EXPECT_EQ(file->tensors()[1].name, "empty");
  EXPECT_EQ(file->tensors()[2].name, "m.bf16");
  EXPECT_EQ(file->tensors()[3].name, "scalar");
  EXPECT_EQ(file->tensors()[4].name, "w.f32");
  const TensorInfo& a = file->tensors()[0];
  EXPECT_EQ(a.dtype, DType::kF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(a.data_begin, 32);  // after the 8 F32 values of w.f32
  EXPECT_EQ(a.data_end, 52);
  EXPECT_EQ(file->tensors()[2].dtype, DType::kBF16);
  EXPECT_EQ(file->tensors()[4].dtype, DType::kF32);
  EXPECT_TRUE(file->Has("scalar"));
  EXPECT_FALSE(file->Has("__metadata__"));
  EXPECT_FALSE(file->Has("nope"));
  EXPECT_EQ(file->RawBytes("a.f16"), Bytes(f16_bits));

  absl::StatusOr<std::vector<float>> got = file->ReadFloat32("w.f32", {2, 4});
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBitwiseEqual(*got, f32);
  got = file->ReadFloat32("a.f16", {10});
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBitwiseEqual(*got, f16_values);
  got = file->ReadFloat32("m.bf16", {3, 1, 2});
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBitwiseEqual(*got, bf16_exact);
  got = file->ReadFloat32("scalar", {});
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBitwiseEqual(*got, {42.0f});
  got = file->ReadFloat32("empty", {0, 3});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
}

TEST(SafetensorsTest, CopiesShareTheMappingAndOutliveTheOriginal) {
  const std::string path =
      WriteTemp(BuildFile({{"x", "F32", {3}, Bytes(std::vector<float>{1, 2, 3})}}));
  std::optional<SafetensorsFile> copy;
  {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    copy = *file;
  }
  absl::StatusOr<std::vector<float>> got = copy->ReadFloat32("x", {3});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<float>{1, 2, 3}));
}

TEST(SafetensorsTest, HalfToFloatIsExactForEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const bool negative = (bits & 0x8000) != 0;
    const int exponent = (bits >> 10) & 0x1f;
    const int mantissa = bits & 0x3ff;
    const float got = HalfToFloat(static_cast<uint16_t>(bits));
    if (exponent == 0x1f) {
      EXPECT_EQ(std::isnan(got), mantissa != 0) << bits;
      if (mantissa == 0) {
        EXPECT_EQ(got, negative ? -INFINITY : INFINITY) << bits;
      }
      continue;
    }
    const double magnitude =
        exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    const double want = negative ? -magnitude : magnitude;
    EXPECT_EQ(static_cast<double>(got), want) << bits;
    EXPECT_EQ(std::signbit(got), negative) << bits;
  }
}

TEST(SafetensorsTest, BFloat16ToFloatIsExactForEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const bool negative = (bits & 0x8000) != 0;
    const int exponent = (bits >> 7) & 0xff;
    const int mantissa = bits & 0x7f;
    const float got = BFloat16ToFloat(static_cast<uint16_t>(bits));
    if (exponent == 0xff) {
      EXPECT_EQ(std::isnan(got), mantissa != 0) << bits;
      continue;
    }
    const double magnitude =
        exponent == 0 ? std::ldexp(mantissa, -133) : std::ldexp(128 + mantissa, exponent - 134);
    EXPECT_EQ(static_cast<double>(got), negative ? -magnitude : magnitude) << bits;
  }
}

TEST(SafetensorsTest, ReadErrorsNameFileAndTensor) {
  const std::string path =
      WriteTemp(BuildFile({{"layer.w", "F32", {2, 3}, Bytes(std::vector<float>(6, 1.0f))}}));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();

  absl::StatusOr<std::vector<float>> missing = file->ReadFloat32("layer.b", {3});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(HasSubstr(path), HasSubstr("'layer.b'")));

  absl::StatusOr<std::vector<float>> wrong = file->ReadFloat32("layer.w", {3, 2});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()),
              AllOf(HasSubstr(path), HasSubstr("'layer.w'"), HasSubstr("[2, 3]"),
                    HasSubstr("expected [3, 2]")));
  EXPECT_FALSE(file->ReadFloat32("layer.w", {6}).ok());
  EXPECT_FALSE(file->ReadFloat32("layer.w", {2, 3, 1}).ok());
}

TEST(SafetensorsTest, MissingFileAndDirectoryAreErrors) {
  const std::string missing = TempPath("does_not_exist.safetensors");
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(missing);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(missing));

  file = SafetensorsFile::Open(::testing::TempDir());
  EXPECT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not a regular file"));
}

TEST(SafetensorsTest, EmptyHeaderAndPaddedHeaderAreValid) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(WriteTemp(Assemble("{}", "")));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors().empty());

  // Writers pad the header with spaces to align the data section to 8 bytes.
  const std::string header = R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}   )";
  file = SafetensorsFile::Open(WriteTemp(Assemble(header, Bytes(std::vector<uint16_t>{0x3C00}))));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<float>> x = file->ReadFloat32("x", {1});
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ((*x)[0], 1.0f);
}

// A malformed file image and the pieces its error message must contain (besides the path).
struct BadCase {
  std::string label;
  std::string contents;
  std::vector<std::string> expected;
};

std::string OneTensor(const std::string& entry, const std::string& data) {
  return Assemble(absl::StrCat(R"({"t":)", entry, "}"), data);
}

std::vector<BadCase> BadCases() {
  const std::string six_floats = Bytes(std::vector<float>(6, 2.0f));
  const std::string good = BuildFile({{"t", "F32", {2, 3}, six_floats}});
  return {
      {"empty_file", "", {"0 bytes", "8-byte header length"}},
      {"short_file", "abcde", {"5 bytes"}},
      {"header_longer_than_file", Le64(100) + "{}", {"header length 100", "2 bytes"}},
      {"header_length_huge", Le64(~uint64_t{0}) + "{}", {"header length 18446744073709551615"}},
      {"header_not_json", Assemble("{\"t\": nope}", ""), {"header is not valid JSON"}},
      {"header_not_object", Assemble("[1, 2]", ""), {"header must be a JSON object", "array"}},
      {"header_truncated_json", Assemble(R"({"t":{"dtype":"F32")", ""), {"not valid JSON"}},
      {"deeply_nested_header",
       Assemble(std::string(100000, '[') + std::string(100000, ']'), ""),
       {"header must be a JSON object"}},
      {"metadata_not_object", Assemble(R"({"__metadata__":[1]})", ""), {"'__metadata__'"}},
      {"entry_not_object", OneTensor("[1]", ""), {"'t'", "entry must be a JSON object"}},
      {"missing_dtype",
       OneTensor(R"({"shape":[0],"data_offsets":[0,0]})", ""),
       {"'t'", "'dtype' is missing"}},
      {"dtype_not_string",
       OneTensor(R"({"dtype":4,"shape":[0],"data_offsets":[0,0]})", ""),
       {"'t'", "'dtype'"}},
      {"unknown_dtype_i64",
       OneTensor(R"({"dtype":"I64","shape":[1],"data_offsets":[0,8]})", std::string(8, '\0')),
       {"'t'", "'dtype'", "\"I64\"", "not supported"}},
      {"unknown_dtype_f8",
       OneTensor(R"({"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]})", std::string(1, '\0')),
       {"'t'", "\"F8_E4M3\""}},
      {"missing_shape",
       OneTensor(R"({"dtype":"F32","data_offsets":[0,0]})", ""),
       {"'t'", "'shape' is missing"}},
      {"shape_not_list",
       OneTensor(R"({"dtype":"F32","shape":3,"data_offsets":[0,12]})", std::string(12, '\0')),
       {"'t'", "'shape' must be a list"}},
      {"shape_negative",
       OneTensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,0]})", ""),
       {"'t'", "'shape'", "negative"}},
      {"shape_float",
       OneTensor(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,0]})", ""),
       {"'t'", "'shape'", "non-negative integers"}},
      {"shape_too_large_for_int64",
       OneTensor(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]})", ""),
       {"'t'", "'shape'", "too large"}},
      {"numel_overflow",
       OneTensor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]})", ""),
       {"'t'", "'shape'", "int64"}},
      {"byte_size_overflow",
       OneTensor(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})", ""),
       {"'t'", "'shape'", "byte size overflows"}},
      {"missing_data_offsets",
       OneTensor(R"({"dtype":"F32","shape":[0]})", ""),
       {"'t'", "'data_offsets' is missing"}},
      {"data_offsets_one_value",
       OneTensor(R"({"dtype":"F32","shape":[0],"data_offsets":[0]})", ""),
       {"'t'", "'data_offsets'", "[begin, end]"}},
      {"data_offsets_not_list",
       OneTensor(R"({"dtype":"F32","shape":[0],"data_offsets":"0,0"})", ""),
       {"'t'", "'data_offsets'"}},
      {"data_offsets_negative",
       OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", std::string(4, '\0')),
       {"'t'", "'data_offsets'", "negative"}},
      {"data_offsets_begin_after_end",
       OneTensor(R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})", std::string(8, '\0')),
       {"'t'", "'data_offsets' [8, 4]", "begin > end"}},
      {"data_offsets_out_of_range",
       OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[4,12]})", std::string(8, '\0')),
       {"'t'", "'data_offsets' [4, 12]", "data section of 8 bytes"}},
      {"data_offsets_huge",
       OneTensor(absl::StrCat(R"({"dtype":"F32","shape":[1],"data_offsets":)",
                              "[9223372036854775800,9223372036854775804]}"),
                 ""),
       {"'t'", "'data_offsets'", "data section of 0 bytes"}},
      {"size_mismatch",
       OneTensor(R"({"dtype":"F16","shape":[2,3],"data_offsets":[0,24]})", std::string(24, '\0')),
       {"'t'", "'data_offsets' [0, 24]", "spans 24 bytes", "[2, 3] of F16 needs 12 bytes"}},
      {"truncated_data",
       good.substr(0, good.size() - 1),
       {"'t'", "runs past the data section of 23 bytes", "truncated"}},
      {"truncated_in_header", good.substr(0, 20), {"header length"}},
  };
}

// Parses `contents`; when that succeeds, opens it from a file and reads every tensor back with
// its own shape. Returns whether it parsed.
bool OpenAndReadAll(const std::string& contents, const std::string& label) {
  int64_t offset = 0;
  absl::StatusOr<std::vector<TensorInfo>> parsed =
      SafetensorsFile::ParseHeader(contents, "mem.safetensors", &offset);
  if (!parsed.ok()) {
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("mem.safetensors: ")) << label;
    return false;
  }
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(WriteTemp(contents));
  EXPECT_TRUE(file.ok()) << label << ": " << file.status();
  if (!file.ok()) return false;
  for (const TensorInfo& t : file->tensors()) {
    absl::StatusOr<std::vector<float>> data = file->ReadFloat32(t.name, t.shape);
    EXPECT_TRUE(data.ok()) << label << ": " << data.status();
    if (data.ok()) {
      EXPECT_EQ(static_cast<int64_t>(data->size()), t.numel()) << label;
    }
  }
  return true;
}

TEST(SafetensorsFuzzTest, EveryTruncationFailsCleanly) {
  const std::string good = BuildFile({{"a", "F16", {3}, Bytes(std::vector<uint16_t>{1, 2, 3})},
                                      {"b", "F32", {2}, Bytes(std::vector<float>{4, 5})}});
  for (size_t len = 0; len < good.size(); ++len) {
    EXPECT_FALSE(OpenAndReadAll(good.substr(0, len), absl::StrCat("length ", len)));
  }
  EXPECT_TRUE(OpenAndReadAll(good, "untruncated"));
}

TEST(SafetensorsFuzzTest, RandomByteMutationsNeverCrash) {
  const std::string good = BuildFile({{"a", "F16", {3}, Bytes(std::vector<uint16_t>{1, 2, 3})},
                                      {"b", "BF16", {2, 1}, Bytes(std::vector<uint16_t>{4, 5})},
                                      {"c", "F32", {2}, Bytes(std::vector<float>{4, 5})}});
  const std::string alphabet = "0123456789[]{},:\"-eE.FBI ";
  int num_parsed = 0;
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    std::mt19937 rng(seed);
    std::string mutated = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % mutated.size();
      // Mostly JSON-ish characters, so that many mutants still parse and reach the checks.
      mutated[at] =
          rng() % 4 == 0 ? static_cast<char>(rng() & 0xff) : alphabet[rng() % alphabet.size()];
    }
    num_parsed += OpenAndReadAll(mutated, absl::StrCat("seed ", seed));
  }
  // Enough mutants stay well-formed for the read path to be exercised too.
  EXPECT_GT(num_parsed, 20);
}

class SafetensorsBadFileTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(SafetensorsBadFileTest, ErrorNamesFileAndField) {
  const BadCase& c = GetParam();
  const std::string path = WriteTemp(c.contents);
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok()) << c.label;
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(path + ": "));
  for (const std::string& piece : c.expected) {
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(piece));
  }
  // The in-memory parser gives the same answer.
  int64_t offset = -1;
  EXPECT_FALSE(SafetensorsFile::ParseHeader(c.contents, path, &offset).ok());
}

INSTANTIATE_TEST_SUITE_P(AllCases, SafetensorsBadFileTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.label;
                         });

}  // namespace
}  // namespace beaconkv
