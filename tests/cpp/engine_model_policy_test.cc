// ModelPolicySpec and BuildModelPolicyConfig: the policy a model directory recommends in its
// config.json ("beaconkv_policy"), read with errors that name the file and field.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model_policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/engine_test_files.h"

namespace beaconkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A model directory whose config.json is `text`.
std::string ModelDir(const std::string& name, const std::string& text) {
  const std::string dir = absl::StrCat(test_files::TempRoot(), "/", name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << text;
  return dir;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ModelPolicyTest, ReadsTheSpecOrNothing) {
  const std::string with =
      ModelDir("with", R"({"hidden_size": 8, "beaconkv_policy": "beacon:blur_speed=0.02"})");
  absl::StatusOr<std::string> spec = ModelPolicySpec(with);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(*spec, "beacon:blur_speed=0.02");
  for (const char* text : {R"({"hidden_size": 8})", R"({"beaconkv_policy": null})"}) {
    spec = ModelPolicySpec(ModelDir("without", text));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(*spec, "") << text;
  }
}

TEST(ModelPolicyTest, MalformedFilesAndFieldsNameTheProblem) {
  const std::string missing = absl::StrCat(test_files::TempRoot(), "/no_such_model");
  absl::Status s = ModelPolicySpec(missing).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), HasSubstr(missing + "/config.json"));
  const std::string dir_as_file = absl::StrCat(test_files::TempRoot(), "/dir_config");
  std::filesystem::create_directories(dir_as_file + "/config.json");
  s = ModelPolicySpec(dir_as_file).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s),
              HasSubstr(dir_as_file + "/config.json: cannot open model config: a directory"));
  EXPECT_THAT(Message(ModelPolicySpec("").status()), HasSubstr("the path is empty"));

  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "top level must be a JSON object"},
      {R"({"beaconkv_policy": 3})", "must be a policy spec string, got number 3"},
      {R"({"beaconkv_policy": ""})", "is empty"},
      {R"({"beaconkv_policy": "lru"})", "unknown policy \"lru\""},
      {R"({"beaconkv_policy": "beacon:n_becons=8"})", "no knob 'n_becons'"},
      {R"({"beaconkv_policy": "beacon:budget=64"})", "it sets 'budget'"},
      {R"({"beaconkv_policy": "model"})", "must name a policy of the registry"},
      {R"({"beaconkv_policy": "beacon:blur_speed=-1"})", "'blur_speed'"},
  };
  for (const Case& c : cases) {
    const std::string dir = ModelDir("bad", c.text);
    s = ModelPolicySpec(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(Message(s), AllOf(HasSubstr(dir + "/config.json"), HasSubstr(c.says))) << c.text;
    // Building "model" from it fails the same way; other policies never read the file.
    EXPECT_THAT(Message(BuildModelPolicyConfig({"model", 96, {}, {}}, dir).status()),
                HasSubstr(c.says));
    EXPECT_TRUE(BuildModelPolicyConfig({"beacon", 96, {}, {}}, dir).ok()) << c.text;
  }
}

TEST(ModelPolicyTest, BuildsTheModelsPolicyOrSaysItHasNone) {
  const std::string dir =
      ModelDir("pooled", R"({"beaconkv_policy": "beacon-pooled:n_recent=32,blur_speed=0.02"})");
  absl::StatusOr<PolicyConfig> c = BuildModelPolicyConfig({"model:n_recent=24", 96, 16, {}}, dir);
  ASSERT_TRUE(c.ok()) << c.status();
  const BeaconConfig& b = std::get<BeaconConfig>(*c);
  EXPECT_EQ(b.budget, 96);
  EXPECT_EQ(b.interval, 16);
  EXPECT_EQ(b.n_recent, 24);
  EXPECT_EQ(b.budget_mode, BudgetMode::kPooled);
  EXPECT_FLOAT_EQ(b.blur_speed, 0.02f);

  const std::string none = ModelDir("none", R"({"hidden_size": 8})");
  const absl::Status s = BuildModelPolicyConfig({"model", 96, {}, {}}, none).status();
  EXPECT_THAT(Message(s), AllOf(HasSubstr("policy 'model'"), HasSubstr(none + "/config.json"),
                                HasSubstr("names no policy of the model")));
}

// The shipped model's recommended setting builds at the budgets it was measured at.
TEST(ModelPolicyTest, TheShippedModelsSpecBuilds) {
  const std::string dir =
      (std::filesystem::path(__FILE__).parent_path() / "../../models/tiny-reasoner")
          .lexically_normal()
          .string();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no shipped model";
  absl::StatusOr<std::string> spec = ModelPolicySpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_FALSE(spec->empty());
  for (int64_t budget : {96, 158}) {
    absl::StatusOr<PolicyConfig> c = BuildModelPolicyConfig({"model", budget, {}, {}}, dir);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(PolicyBudget(*c), budget);
  }
}

}  // namespace
}  // namespace beaconkv
