// ModelConfig::FromJson on HF config.json files: defaults, every required field, bad types,
// inconsistent head counts and the features the engine rejects by name.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

using ::testing::HasSubstr;

constexpr char kFile[] = "/models/m/config.json";

// A Qwen2-0.5B-like config.
constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "rope_scaling": null,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// The smallest config that parses: every field that has a default is left out.
constexpr char kMinimal[] = R"({"vocab_size": 73, "hidden_size": 128, "intermediate_size": 384,
  "num_hidden_layers": 4, "num_attention_heads": 4, "max_position_embeddings": 2048})";

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ModelConfigTest, ParsesQwen2Config) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(kQwen2, kFile);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->intermediate_size, 4864);
  EXPECT_EQ(c->num_layers, 24);
  EXPECT_EQ(c->num_heads, 14);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->q_dim(), 896);
  EXPECT_EQ(c->kv_dim(), 128);
  EXPECT_EQ(c->group_size(), 7);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->Validate().ok());
}

TEST(ModelConfigTest, DefaultsForAbsentFields) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(kMinimal, kFile);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 4);  // = num_attention_heads
  EXPECT_EQ(c->head_dim, 32);     // = hidden_size / num_attention_heads
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->architecture, "");
}

TEST(ModelConfigTest, NullMeansAbsent) {
  const std::string text = absl::StrReplaceAll(
      kMinimal, {{"\"vocab_size\"",
                  "\"head_dim\": null, \"num_key_value_heads\": null, \"rope_theta\": null, "
                  "\"vocab_size\""}});
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(text, kFile);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->rope_theta, 10000.0f);
}

TEST(ModelConfigTest, ExplicitHeadDimMayDifferFromHiddenOverHeads) {
  // Qwen3-0.6B: 16 heads of 128 over a 1024-wide residual stream.
  const std::string text = R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
      "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
      "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
      "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
      "tie_word_embeddings": true, "rope_scaling": null})";
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(text, kFile);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 2048);
  EXPECT_EQ(c->rope_theta, 1e6f);  // an integer is accepted for a float field
}

TEST(ModelConfigTest, FromFileReadsAndNamesTheFile) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/bkv_config_test_", getpid(), "_config.json");
  {
    std::ofstream out(path);
    out << kQwen2;
  }
  absl::StatusOr<ModelConfig> c = ModelConfig::FromFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 24);
  std::remove(path.c_str());
  c = ModelConfig::FromFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(c.status()), HasSubstr(path));
}

class RequiredFieldTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RequiredFieldTest, MissingFieldIsNamed) {
  const std::string key = GetParam();
  std::string text = kMinimal;
  const size_t at = text.find(absl::StrCat("\"", key, "\""));
  ASSERT_NE(at, std::string::npos);
  text.replace(at, key.size() + 2, absl::StrCat("\"renamed_", key, "\""));
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(text, kFile);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), HasSubstr(absl::StrCat(kFile, ": field '", key, "' is missing")));
}

INSTANTIATE_TEST_SUITE_P(AllRequired, RequiredFieldTest,
                         ::testing::Values("vocab_size", "hidden_size", "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads",
                                           "max_position_embeddings"));

// A config text with `extra` added to kMinimal, and the pieces its error message must contain.
struct BadConfig {
  std::string label;
  std::string extra;  // inserted as the first members of the object; later keys win in nlohmann
  std::vector<std::string> expected;
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, ErrorNamesFileAndField) {
  const BadConfig& b = GetParam();
  // Replace the value of a duplicated key by removing the original first.
  std::string text = kMinimal;
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "max_position_embeddings", "intermediate_size"}) {
    const std::string quoted = absl::StrCat("\"", key, "\"");
    if (b.extra.find(quoted) == std::string::npos) continue;
    const size_t at = text.find(quoted);
    text.replace(at, quoted.size(), absl::StrCat("\"unused_", key, "\""));
  }
  text = absl::StrCat("{", b.extra, ", ", text.substr(1));
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(text, kFile);
  ASSERT_FALSE(c.ok()) << b.label;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), HasSubstr(absl::StrCat(kFile, ": ")));
  for (const std::string& piece : b.expected) EXPECT_THAT(Msg(c.status()), HasSubstr(piece));
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadConfigTest,
    ::testing::Values(
        BadConfig{"size_as_string", R"("hidden_size": "128")", {"'hidden_size'", "integer"}},
        BadConfig{"size_as_float", R"("vocab_size": 73.5)", {"'vocab_size'", "integer"}},
        BadConfig{"size_too_large",
                  R"("intermediate_size": 4294967296)",
                  {"'intermediate_size'", "int32"}},
        BadConfig{"size_zero", R"("num_hidden_layers": 0)", {"num_hidden_layers", ">= 1"}},
        BadConfig{"size_negative", R"("vocab_size": -3)", {"vocab_size", ">= 1"}},
        BadConfig{"kv_heads_zero", R"("num_key_value_heads": 0)", {"num_key_value_heads"}},
        BadConfig{"heads_not_divisible",
                  R"("num_key_value_heads": 3)",
                  {"num_attention_heads = 4", "num_key_value_heads = 3", "multiple"}},
        BadConfig{"head_dim_odd", R"("head_dim": 7)", {"head_dim", "even"}},
        BadConfig{"head_dim_not_derivable",
                  R"("num_attention_heads": 3)",
                  {"'head_dim'", "hidden_size (128)", "num_attention_heads (3)"}},
        BadConfig{"head_dim_string", R"("head_dim": "32")", {"'head_dim'", "integer"}},
        BadConfig{"rope_theta_string", R"("rope_theta": "1e4")", {"'rope_theta'", "number"}},
        BadConfig{"rope_theta_zero", R"("rope_theta": 0)", {"rope_theta", "positive"}},
        BadConfig{"rope_theta_too_large", R"("rope_theta": 1e300)", {"'rope_theta'", "float32"}},
        BadConfig{"eps_negative", R"("rms_norm_eps": -1e-5)", {"rms_norm_eps", "positive"}},
        BadConfig{"tie_as_string",
                  R"("tie_word_embeddings": "yes")",
                  {"'tie_word_embeddings'", "true or false"}},
        BadConfig{"architectures_string",
                  R"("architectures": "LlamaForCausalLM")",
                  {"'architectures'", "list of strings"}},
        BadConfig{"architectures_empty", R"("architectures": [])", {"'architectures'"}},
        BadConfig{"architecture_unsupported",
                  R"("architectures": ["GPT2LMHeadModel"])",
                  {"'architectures'", "GPT2LMHeadModel"}},
        BadConfig{"rope_scaling",
                  R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})",
                  {"'rope_scaling'", "llama3", "not supported"}},
        BadConfig{"hidden_act", R"("hidden_act": "gelu")", {"'hidden_act'", "gelu", "silu"}},
        BadConfig{"mlp_bias", R"("mlp_bias": true)", {"'mlp_bias'"}},
        BadConfig{"sliding_window", R"("use_sliding_window": true)", {"'use_sliding_window'"}},
        BadConfig{
            "partial_rotary", R"("partial_rotary_factor": 0.5)", {"'partial_rotary_factor'"}}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.label; });

TEST(ModelConfigTest, NotJsonOrNotObject) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson("{\"vocab_size\": ", kFile);
  EXPECT_THAT(Msg(c.status()), HasSubstr(absl::StrCat(kFile, ": not valid JSON")));
  c = ModelConfig::FromJson("[1, 2]", kFile);
  EXPECT_THAT(Msg(c.status()), HasSubstr("must be a JSON object"));
  c = ModelConfig::FromJson("", kFile);
  EXPECT_FALSE(c.ok());
}

TEST(ModelConfigTest, ValidateRejectsDefaultConstructed) {
  EXPECT_FALSE(ModelConfig{}.Validate().ok());
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(kMinimal, kFile);
  ASSERT_TRUE(c.ok());
  ModelConfig bad = *c;
  bad.num_kv_heads = 3;
  EXPECT_THAT(Msg(bad.Validate()), HasSubstr("num_kv_heads"));
  bad = *c;
  bad.rms_norm_eps = 0.0f;
  EXPECT_THAT(Msg(bad.Validate()), HasSubstr("rms_norm_eps"));
  bad = *c;
  bad.architecture = "MambaForCausalLM";
  EXPECT_THAT(Msg(bad.Validate()), HasSubstr("MambaForCausalLM"));
}

}  // namespace
}  // namespace beaconkv
