// CI variant of the preemption stress program (tests/stress/preemption_stress_main.cc): for
// every policy and both preemption modes, requests with random lengths arrive in bursts at a
// pool 4x oversubscribed, with VerifyIntegrity() after every step. Every request completes,
// no block leaks, and swap (and recompute with the full cache, which is exact too) produce the
// outputs of an unconstrained run.
#include "tests/stress/preemption_stress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>

namespace beaconkv {
namespace {

class PreemptionStressTest
    : public ::testing::TestWithParam<std::tuple<std::string, PreemptionMode>> {};

TEST_P(PreemptionStressTest, EveryRequestCompletesAndSwapIsExact) {
  const auto& [policy, mode] = GetParam();
  stress::Options opts;
  opts.num_requests = 200;
  opts.seed = 5;
  SCOPED_TRACE(::testing::Message() << "policy " << policy << ", seed " << opts.seed);
  const PolicyConfig config = stress::SmallPolicy(policy);
  const stress::Result r = stress::Run(config, mode, opts, /*constrained=*/true);
  ASSERT_EQ(stress::CheckComplete(r, opts), "");
  const int64_t preemptions = r.stats.preemptions_recompute + r.stats.preemptions_swap;
  std::printf("%s %s: %d blocks, %lld steps, preemptions recompute %lld swap %lld\n",
              policy.c_str(), mode == PreemptionMode::kSwap ? "swap" : "recompute", r.num_blocks,
              static_cast<long long>(r.stats.steps),
              static_cast<long long>(r.stats.preemptions_recompute),
              static_cast<long long>(r.stats.preemptions_swap));
  if (policy == "full") {
    EXPECT_GT(preemptions, 0) << "the pool is not under pressure";
  }
  if (mode == PreemptionMode::kSwap) {
    EXPECT_EQ(r.stats.preemptions_recompute, 0);
  }
  if (mode == PreemptionMode::kSwap || policy == "full") {
    stress::Options free_opts = opts;
    free_opts.verify_every_step = false;
    const stress::Result ref = stress::Run(config, mode, free_opts, /*constrained=*/false);
    ASSERT_EQ(stress::CheckComplete(ref, opts), "");
    EXPECT_EQ(ref.stats.preemptions_recompute + ref.stats.preemptions_swap, 0);
    EXPECT_EQ(stress::CompareOutputs(r, ref), "");
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PreemptionStressTest,
                         ::testing::Combine(::testing::Values("full", "streaming", "h2o", "tova",
                                                              "snapkv", "rkv", "rpc", "beacon"),
                                            ::testing::Values(PreemptionMode::kRecompute,
                                                              PreemptionMode::kSwap)),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == PreemptionMode::kSwap ? "_swap"
                                                                                    : "_recompute");
                         });

}  // namespace
}  // namespace beaconkv
