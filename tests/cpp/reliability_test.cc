// Regression tests for the failure classes of the reliability review (issue 13): engine
// configuration validated once in 64 bits, statistics defined on every path, teacher forcing
// that cannot fit, and safetensors headers whose tensors collide.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_config.h"
#include "engine/safetensors.h"
#include "tests/cpp/engine_test_files.h"
#include "tests/cpp/random_model.h"

namespace beaconkv {
namespace {

using ::testing::HasSubstr;

absl::Status CreateWith(EngineConfig c, int32_t max_position_embeddings = 512) {
  return Engine::Create(test_model::RandomModel(1, max_position_embeddings), c).status();
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(EngineConfigTest, MaxModelLenMustBeZeroOrWithinThePositionTable) {
  EngineConfig c;
  c.max_model_len = -5;
  absl::Status s = CreateWith(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("max_model_len=-5"));
  c.max_model_len = 513;
  s = CreateWith(c);
  EXPECT_THAT(Message(s), HasSubstr("exceeds the model's max_position_embeddings=512"));
  c.max_model_len = 512;
  EXPECT_TRUE(CreateWith(c).ok());
}

TEST(EngineConfigTest, DefaultPoolSizeIsComputedIn64Bits) {
  // 1 + 10^6 * 4 heads * 32 blocks fits int32 after a wrap in 32-bit arithmetic would not:
  // 2^31 / (4 * 32) ~ 16.7M sequences is the int32 edge; 10^8 wraps.
  ModelConfig mc = test_model::RandomModel(1).config;
  EngineConfig c;
  c.max_batch = 100'000'000;
  absl::Status s = ResolveEngineConfig(mc, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("max_batch=100000000"));
  EXPECT_THAT(Message(s), HasSubstr("set num_blocks"));

  c = EngineConfig{};
  c.max_batch = 3;
  c.max_model_len = 100;
  ASSERT_TRUE(ResolveEngineConfig(mc, &c).ok());
  EXPECT_EQ(c.num_blocks, 1 + 3 * 4 * 7);  // 4 heads, ceil(100 / 16) blocks each
}

TEST(EngineConfigTest, APoolLargerThanTheMachineIsResourceExhausted) {
  ModelConfig mc = test_model::RandomModel(1).config;
  EngineConfig c;
  c.num_blocks = 2'000'000'000;
  c.block_size = 1024;
  const absl::Status s = ResolveEngineConfig(mc, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Message(s), HasSubstr("GiB"));
}

TEST(EngineConfigTest, EveryFieldIsNamed) {
  ModelConfig mc = test_model::RandomModel(1).config;
  struct Case {
    const char* field;
    void (*set)(EngineConfig&);
  };
  const std::vector<Case> cases = {
      {"block_size=0", [](EngineConfig& c) { c.block_size = 0; }},
      {"max_batch=0", [](EngineConfig& c) { c.max_batch = 0; }},
      {"watermark_blocks=-1", [](EngineConfig& c) { c.watermark_blocks = -1; }},
      {"num_blocks=-3", [](EngineConfig& c) { c.num_blocks = -3; }},
      {"num_host_blocks=-1", [](EngineConfig& c) { c.num_host_blocks = -1; }},
      {"num_threads=0", [](EngineConfig& c) { c.num_threads = 0; }},
      {"eos_token_id=23", [](EngineConfig& c) { c.eos_token_id = 23; }},
      {"watermark_blocks=50",
       [](EngineConfig& c) {
         c.num_blocks = 50;
         c.watermark_blocks = 50;
       }},
  };
  for (const Case& k : cases) {
    EngineConfig c;
    k.set(c);
    const absl::Status s = ResolveEngineConfig(mc, &c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.field;
    EXPECT_THAT(Message(s), HasSubstr(k.field));
  }
}

TEST(EngineStatsTest, ARequestFinishedAtAdmissionReportsItsPeakKv) {
  EngineConfig c;
  c.block_size = 4;
  auto e = Engine::Create(test_model::RandomModel(1), c);
  ASSERT_TRUE(e.ok()) << e.status();
  Request r;
  r.id = 7;
  r.prompt = {1, 2, 3, 4, 5, 6};
  r.sampling.max_new_tokens = 1;  // the token sampled from the prefill ends it
  ASSERT_TRUE((*e)->AddRequest(r).ok());
  auto outs = (*e)->RunToCompletion();
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), 1u);
  const RequestOutput& o = outs->front();
  EXPECT_EQ(o.finish_reason, FinishReason::kLength);
  EXPECT_EQ(o.peak_retained_tokens, 6.0);
  EXPECT_EQ(o.peak_blocks, 4 * 2);  // 4 heads x 2 blocks of 4 slots
  EXPECT_EQ((*e)->stats().peak_used_blocks, 8);
}

TEST(EngineRequestTest, ForcedOutputMustFitUnderMaxModelLen) {
  EngineConfig c;
  c.max_model_len = 20;
  auto e = Engine::Create(test_model::RandomModel(1), c);
  ASSERT_TRUE(e.ok()) << e.status();
  Request r;
  r.id = 3;
  r.prompt = {1, 2, 3, 4, 5};
  r.forced_output.assign(16, 2);  // 5 + 16 > 20
  r.sampling.max_new_tokens = 16;
  const absl::Status s = (*e)->AddRequest(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("forced output of 16 tokens exceeds max_model_len 20"));
  r.forced_output.resize(15);  // exactly fits: every forced token gets its logits
  r.sampling.max_new_tokens = 15;
  ASSERT_TRUE((*e)->AddRequest(r).ok());
  auto outs = (*e)->RunToCompletion();
  ASSERT_TRUE(outs.ok());
  EXPECT_EQ(outs->front().output.size(), 15u);
  EXPECT_EQ(outs->front().finish_reason, FinishReason::kForced);
}

std::string Header(const std::string& json) { return test_files::Le64(json.size()) + json; }

TEST(SafetensorsCollisionTest, ATensorNamedTwiceIsRejected) {
  const std::string file = Header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") +
                           std::string(8, '\0');
  int64_t offset = 0;
  auto t = SafetensorsFile::ParseHeader(file, "dup.safetensors", &offset);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(Message(t.status()), HasSubstr("dup.safetensors: header names 'a' twice"));
}

TEST(SafetensorsCollisionTest, OverlappingTensorsAreRejected) {
  const std::string file = Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") +
                           std::string(12, '\0');
  int64_t offset = 0;
  auto t = SafetensorsFile::ParseHeader(file, "ovl.safetensors", &offset);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(Message(t.status()), HasSubstr("tensors 'a' (bytes [0, 8)) and 'b'"));
  EXPECT_THAT(Message(t.status()), HasSubstr("overlap"));
}

TEST(SafetensorsCollisionTest, AdjacentAndEmptyTensorsAreFine) {
  const std::string file = Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})") +
                           std::string(12, '\0');
  int64_t offset = 0;
  auto t = SafetensorsFile::ParseHeader(file, "ok.safetensors", &offset);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 3u);
}

}  // namespace
}  // namespace beaconkv

namespace beaconkv {
namespace {

// Found by tests/fuzz/block_manager_fuzz: a sequence compacted to zero blocks swapped out of a
// manager without a host pool dereferenced the missing host store (UBSan in the ASan build).
TEST(BlockManagerSwapTest, AnEmptySequenceSwapsWithoutAHostPool) {
  BlockManagerConfig c;
  c.shape = {1, 2, 2, 4};
  c.num_blocks = 9;
  auto store = std::make_unique<CpuKvStore>(c.num_blocks, 4, 2);
  auto bm = BlockManager::Create(c, store.get());
  ASSERT_TRUE(bm.ok());
  ASSERT_TRUE((*bm)->AddSequence(1, 5).ok());
  ASSERT_TRUE((*bm)->ApplyKeepSets(1, {KeepSet{0, 0, {}}, KeepSet{0, 1, {}}}).ok());
  EXPECT_EQ(*(*bm)->NumBlocksOf(1), 0);
  EXPECT_TRUE((*bm)->SwapOut(1).ok());
  EXPECT_TRUE((*bm)->SwapIn(1).ok());
  ASSERT_TRUE((*bm)->AddSequence(2, 5).ok());
  EXPECT_EQ((*bm)->SwapOut(2).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*bm)->VerifyIntegrity().ok());
}

}  // namespace
}  // namespace beaconkv
