// LoadModelWeights on Llama-, Qwen2- and Qwen3-shaped checkpoints written here in F32, F16 and
// BF16; errors for missing, misshapen and unexpected tensors; and, where it exists, the shipped
// tiny reasoner.
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/model_weights.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/engine_test_files.h"

namespace beaconkv {
namespace {

using test_files::Le64;
using test_files::TempRoot;

using ::testing::AllOf;
using ::testing::HasSubstr;

enum class Arch { kLlama, kQwen2, kQwen3 };

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // every value exactly representable in F16 and BF16
};

// Encodes a normal (or zero) half-precision value exactly.
uint16_t ToHalf(float v) {
  if (v == 0.0f) return std::signbit(v) ? 0x8000 : 0;
  int e = 0;
  const float m = std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  const int exponent = e - 1 + 15;
  const int mantissa = static_cast<int>((m * 2.0f - 1.0f) * 1024.0f);
  EXPECT_TRUE(exponent > 0 && exponent < 31) << v;
  return static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | (exponent << 10) | mantissa);
}

std::string Encode(const std::vector<float>& values, const std::string& dtype) {
  std::string out;
  for (float v : values) {
    if (dtype == "F32") {
      const uint32_t bits = std::bit_cast<uint32_t>(v);
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    } else {
      const uint16_t bits =
          dtype == "F16" ? ToHalf(v) : static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
      out.push_back(static_cast<char>(bits & 0xff));
      out.push_back(static_cast<char>(bits >> 8));
    }
  }
  return out;
}

std::string BuildFile(const std::vector<Tensor>& tensors, const std::string& dtype) {
  std::vector<std::string> entries;
  std::string data;
  for (const Tensor& t : tensors) {
    const std::string bytes = Encode(t.values, dtype);
    entries.push_back(absl::StrFormat(R"("%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]})",
                                      t.name, dtype, absl::StrJoin(t.shape, ","), data.size(),
                                      data.size() + bytes.size()));
    data += bytes;
  }
  const std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  return Le64(header.size()) + header + data;
}

// A tiny model: vocab 7, hidden 4, intermediate 6, 2 layers, 2 query heads over 1 kv head.
// Qwen3 uses an explicit head_dim of 4 (num_heads * head_dim != hidden).
struct TinyModel {
  std::string config_json;
  std::vector<Tensor> tensors;
  std::map<std::string, std::vector<float>> values;  // name -> expected float32 contents
};

TinyModel MakeTinyModel(Arch arch, bool tied) {
  const int64_t vocab = 7, hidden = 4, inter = 6, layers = 2, heads = 2, kv_heads = 1;
  const int64_t head_dim = arch == Arch::kQwen3 ? 4 : hidden / heads;
  const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
  const char* name = arch == Arch::kLlama   ? "LlamaForCausalLM"
                     : arch == Arch::kQwen2 ? "Qwen2ForCausalLM"
                                            : "Qwen3ForCausalLM";
  TinyModel m;
  m.config_json = absl::StrFormat(
      R"({"architectures":["%s"],"vocab_size":%d,"hidden_size":%d,"intermediate_size":%d,
          "num_hidden_layers":%d,"num_attention_heads":%d,"num_key_value_heads":%d,%s
          "rope_theta":1000000.0,"rms_norm_eps":1e-06,"max_position_embeddings":64,
          "tie_word_embeddings":%s,"hidden_act":"silu","rope_scaling":null})",
      name, vocab, hidden, inter, layers, heads, kv_heads,
      arch == Arch::kQwen3 ? absl::StrFormat(R"("head_dim":%d,)", head_dim) : "",
      tied ? "true" : "false");
  int counter = 0;
  auto add = [&](const std::string& tensor, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) {
      values[i] = static_cast<float>((counter * 37 + i * 11) % 200 - 100) / 4.0f;
    }
    ++counter;
    m.values[tensor] = values;
    m.tensors.push_back({tensor, std::move(shape), std::move(values)});
  };
  add("model.embed_tokens.weight", {vocab, hidden});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {hidden});
    add(p + "self_attn.q_proj.weight", {q_dim, hidden});
    add(p + "self_attn.k_proj.weight", {kv_dim, hidden});
    add(p + "self_attn.v_proj.weight", {kv_dim, hidden});
    add(p + "self_attn.o_proj.weight", {hidden, q_dim});
    if (arch == Arch::kQwen2) {
      add(p + "self_attn.q_proj.bias", {q_dim});
      add(p + "self_attn.k_proj.bias", {kv_dim});
      add(p + "self_attn.v_proj.bias", {kv_dim});
    }
    if (arch == Arch::kQwen3) {
      add(p + "self_attn.q_norm.weight", {head_dim});
      add(p + "self_attn.k_norm.weight", {head_dim});
    }
    add(p + "post_attention_layernorm.weight", {hidden});
    add(p + "mlp.gate_proj.weight", {inter, hidden});
    add(p + "mlp.up_proj.weight", {inter, hidden});
    add(p + "mlp.down_proj.weight", {hidden, inter});
  }
  add("model.norm.weight", {hidden});
  if (!tied) add("lm_head.weight", {vocab, hidden});
  return m;
}

std::string TempDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = absl::StrCat(info->test_suite_name(), "_", info->name());
  for (char& c : test) {
    if (c == '/') c = '_';
  }
  const std::string dir = absl::StrCat(TempRoot(), "/bkv_weights_", test);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Writes config.json and model.safetensors of `m` (in `dtype`) to a fresh directory.
std::string WriteModel(const TinyModel& m, const std::string& dtype) {
  const std::string dir = TempDir();
  WriteFile(dir + "/config.json", m.config_json);
  WriteFile(dir + "/model.safetensors", BuildFile(m.tensors, dtype));
  return dir;
}

class ModelWeightsRoundTripTest
    : public ::testing::TestWithParam<std::tuple<Arch, bool, std::string>> {};

TEST_P(ModelWeightsRoundTripTest, LoadsEveryTensorExactly) {
  const auto [arch, tied, dtype] = GetParam();
  const TinyModel m = MakeTinyModel(arch, tied);
  absl::StatusOr<ModelWeights> w = LoadModelWeights(WriteModel(m, dtype));
  ASSERT_TRUE(w.ok()) << w.status();

  const ModelConfig& c = w->config;
  EXPECT_EQ(c.vocab_size, 7);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.head_dim, arch == Arch::kQwen3 ? 4 : 2);
  EXPECT_EQ(c.tie_word_embeddings, tied);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(w->embed, m.values.at("model.embed_tokens.weight"));
  EXPECT_EQ(w->final_norm, m.values.at("model.norm.weight"));
  EXPECT_EQ(w->lm_head, m.values.at(tied ? "model.embed_tokens.weight" : "lm_head.weight"));
  ASSERT_EQ(w->layers.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    const LayerWeights& lw = w->layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string a = p + "self_attn.";
    EXPECT_EQ(lw.input_norm, m.values.at(p + "input_layernorm.weight"));
    EXPECT_EQ(lw.q_proj, m.values.at(a + "q_proj.weight"));
    EXPECT_EQ(lw.k_proj, m.values.at(a + "k_proj.weight"));
    EXPECT_EQ(lw.v_proj, m.values.at(a + "v_proj.weight"));
    EXPECT_EQ(lw.o_proj, m.values.at(a + "o_proj.weight"));
    EXPECT_EQ(lw.post_norm, m.values.at(p + "post_attention_layernorm.weight"));
    EXPECT_EQ(lw.gate_proj, m.values.at(p + "mlp.gate_proj.weight"));
    EXPECT_EQ(lw.up_proj, m.values.at(p + "mlp.up_proj.weight"));
    EXPECT_EQ(lw.down_proj, m.values.at(p + "mlp.down_proj.weight"));
    EXPECT_EQ(lw.q_proj.size(), static_cast<size_t>(c.q_dim() * c.hidden_size));
    EXPECT_EQ(lw.k_proj.size(), static_cast<size_t>(c.kv_dim() * c.hidden_size));
    if (arch == Arch::kQwen2) {
      EXPECT_EQ(lw.q_bias, m.values.at(a + "q_proj.bias"));
      EXPECT_EQ(lw.k_bias, m.values.at(a + "k_proj.bias"));
      EXPECT_EQ(lw.v_bias, m.values.at(a + "v_proj.bias"));
    } else {
      EXPECT_TRUE(lw.q_bias.empty() && lw.k_bias.empty() && lw.v_bias.empty());
    }
    if (arch == Arch::kQwen3) {
      EXPECT_EQ(lw.q_norm, m.values.at(a + "q_norm.weight"));
      EXPECT_EQ(lw.k_norm, m.values.at(a + "k_norm.weight"));
    } else {
      EXPECT_TRUE(lw.q_norm.empty() && lw.k_norm.empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllArchitectures, ModelWeightsRoundTripTest,
    ::testing::Combine(::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3),
                       ::testing::Bool(), ::testing::Values("F32", "F16", "BF16")),
    [](const auto& info) {
      const Arch arch = std::get<0>(info.param);
      return absl::StrCat(arch == Arch::kLlama   ? "Llama"
                          : arch == Arch::kQwen2 ? "Qwen2"
                                                 : "Qwen3",
                          std::get<1>(info.param) ? "Tied" : "Untied", std::get<2>(info.param));
    });

// Loads `m` and expects an error mentioning `path_suffix`'s full path and every piece.
void ExpectLoadError(const TinyModel& m, absl::StatusCode code, const std::string& file,
                     const std::vector<std::string>& pieces) {
  const std::string dir = WriteModel(m, "F32");
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), code) << w.status();
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(absl::StrCat(dir, "/", file, ": ")));
  for (const std::string& piece : pieces)
    EXPECT_THAT(std::string(w.status().message()), HasSubstr(piece));
}

void Remove(TinyModel& m, const std::string& name) {
  std::erase_if(m.tensors, [&](const Tensor& t) { return t.name == name; });
}

TEST(ModelWeightsErrorTest, MissingTensor) {
  TinyModel m = MakeTinyModel(Arch::kLlama, false);
  Remove(m, "model.layers.1.mlp.up_proj.weight");
  ExpectLoadError(m, absl::StatusCode::kNotFound, "model.safetensors",
                  {"'model.layers.1.mlp.up_proj.weight' is missing", "[6, 4]"});
}

TEST(ModelWeightsErrorTest, ShapeDisagreesWithConfig) {
  TinyModel m = MakeTinyModel(Arch::kLlama, false);
  for (Tensor& t : m.tensors) {
    if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {4, 2};  // numel kept
  }
  ExpectLoadError(m, absl::StatusCode::kInvalidArgument, "model.safetensors",
                  {"'model.layers.0.self_attn.k_proj.weight'", "shape [4, 2]", "expected [2, 4]"});
}

TEST(ModelWeightsErrorTest, ExtraLayerIsRejected) {
  TinyModel m = MakeTinyModel(Arch::kLlama, false);
  m.tensors.push_back({"model.layers.2.input_layernorm.weight", {4}, {1, 2, 3, 4}});
  ExpectLoadError(m, absl::StatusCode::kInvalidArgument, "model.safetensors",
                  {"'model.layers.2.input_layernorm.weight'", "num_hidden_layers=2"});
}

TEST(ModelWeightsErrorTest, HugeLayerCountFailsAtTheFirstMissingLayer) {
  // A config claiming ~2 billion layers over a file with 2: a clear error at layer 2, without
  // first allocating room for every claimed layer (which under ASan would abort on memory).
  TinyModel m = MakeTinyModel(Arch::kLlama, false);
  const std::string from = R"("num_hidden_layers":2,)";
  const size_t at = m.config_json.find(from);
  ASSERT_NE(at, std::string::npos);
  m.config_json.replace(at, from.size(), R"("num_hidden_layers":2000000000,)");
  ExpectLoadError(m, absl::StatusCode::kNotFound, "model.safetensors",
                  {"'model.layers.2.input_layernorm.weight' is missing"});
}

TEST(ModelWeightsErrorTest, UnsupportedBiasIsRejected) {
  TinyModel m = MakeTinyModel(Arch::kQwen2, false);
  m.tensors.push_back({"model.layers.0.self_attn.o_proj.bias", {4}, {1, 2, 3, 4}});
  ExpectLoadError(m, absl::StatusCode::kInvalidArgument, "model.safetensors",
                  {"'model.layers.0.self_attn.o_proj.bias'", "not used"});
}

TEST(ModelWeightsErrorTest, WrongBiasShape) {
  TinyModel m = MakeTinyModel(Arch::kQwen2, false);
  for (Tensor& t : m.tensors) {
    if (t.name == "model.layers.1.self_attn.k_proj.bias") t = {t.name, {1, 2}, t.values};
  }
  ExpectLoadError(m, absl::StatusCode::kInvalidArgument, "model.safetensors",
                  {"'model.layers.1.self_attn.k_proj.bias'", "expected [2]"});
}

TEST(ModelWeightsErrorTest, UntiedWithoutLmHead) {
  TinyModel m = MakeTinyModel(Arch::kLlama, false);
  Remove(m, "lm_head.weight");
  ExpectLoadError(m, absl::StatusCode::kNotFound, "model.safetensors",
                  {"'lm_head.weight'", "'tie_word_embeddings' is false"});
}

TEST(ModelWeightsErrorTest, TiedWithMisshapenLmHead) {
  TinyModel m = MakeTinyModel(Arch::kLlama, true);
  m.tensors.push_back({"lm_head.weight", {4, 7}, std::vector<float>(28, 0.5f)});
  ExpectLoadError(m, absl::StatusCode::kInvalidArgument, "model.safetensors",
                  {"'lm_head.weight'", "expected [7, 4]"});
}

TEST(ModelWeightsTest, TiedCheckpointWithLmHeadUsesTheEmbedding) {
  TinyModel m = MakeTinyModel(Arch::kLlama, true);
  m.tensors.push_back({"lm_head.weight", {7, 4}, std::vector<float>(28, 0.5f)});
  m.tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {1}, {1.0f}});
  absl::StatusOr<ModelWeights> w = LoadModelWeights(WriteModel(m, "BF16"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->lm_head, w->embed);
}

TEST(ModelWeightsErrorTest, BadConfigNamesConfigFile) {
  TinyModel m = MakeTinyModel(Arch::kLlama, false);
  m.config_json = R"({"vocab_size":7,"hidden_size":4})";
  ExpectLoadError(m, absl::StatusCode::kInvalidArgument, "config.json", {"'intermediate_size'"});
}

TEST(ModelWeightsErrorTest, MissingFiles) {
  const std::string dir = TempDir();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dir + "/config.json"));

  WriteFile(dir + "/config.json", MakeTinyModel(Arch::kLlama, false).config_json);
  w = LoadModelWeights(dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dir + "/model.safetensors"));
}

TEST(ModelWeightsErrorTest, TruncatedSafetensors) {
  const TinyModel m = MakeTinyModel(Arch::kLlama, false);
  const std::string dir = WriteModel(m, "F16");
  const std::string full = BuildFile(m.tensors, "F16");
  WriteFile(dir + "/model.safetensors", full.substr(0, full.size() - 10));
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()),
              AllOf(HasSubstr(dir + "/model.safetensors: tensor '"), HasSubstr("truncated")));
}

// The shipped tiny reasoner, when it has been trained: override with BEACONKV_TINY_MODEL_DIR.
std::string TinyReasonerDir() {
  if (const char* env = std::getenv("BEACONKV_TINY_MODEL_DIR")) return env;
  return (std::filesystem::path(__FILE__).parent_path() / "../../models/tiny-reasoner")
      .lexically_normal()
      .string();
}

TEST(TinyReasonerTest, LoadsAndMatchesItsConfig) {
  const std::string dir = TinyReasonerDir();
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    if (!std::filesystem::exists(absl::StrCat(dir, "/", f)))
      GTEST_SKIP() << dir << "/" << f << " is absent";
  }
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = w->config;
  const size_t vocab = c.vocab_size, hidden = c.hidden_size, inter = c.intermediate_size;
  const size_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  EXPECT_EQ(w->embed.size(), vocab * hidden);
  EXPECT_EQ(w->lm_head.size(), vocab * hidden);
  EXPECT_EQ(w->final_norm.size(), hidden);
  ASSERT_EQ(w->layers.size(), static_cast<size_t>(c.num_layers));
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.input_norm.size(), hidden);
    EXPECT_EQ(l.q_proj.size(), q_dim * hidden);
    EXPECT_EQ(l.k_proj.size(), kv_dim * hidden);
    EXPECT_EQ(l.v_proj.size(), kv_dim * hidden);
    EXPECT_EQ(l.o_proj.size(), hidden * q_dim);
    EXPECT_EQ(l.post_norm.size(), hidden);
    EXPECT_EQ(l.gate_proj.size(), inter * hidden);
    EXPECT_EQ(l.up_proj.size(), inter * hidden);
    EXPECT_EQ(l.down_proj.size(), hidden * inter);
    for (float v : l.q_proj) ASSERT_TRUE(std::isfinite(v));
  }

  absl::StatusOr<CharTokenizer> tok = CharTokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_LE(tok->vocab_size(), c.vocab_size);
  const std::string text = "A-7064422900\n|0000000000\n-0111111111\n=3935577099\nP?\n#5380135441";
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), text.size());
  EXPECT_EQ(tok->Decode(*ids), text);
}

}  // namespace
}  // namespace beaconkv
