// The preemption stress program: 10,000 requests (by default) with random prompt and output
// lengths arrive in bursts at a pool 4x oversubscribed, for every policy and both preemption
// modes. Checks that every request completes, no block leaks, and swap outputs equal an
// unconstrained run; prints the preemption counts. Exit status 1 on any failure.
//
//   build/t/tests/cpp/preemption_stress [--requests N] [--seed S] [--no-verify]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/stress/preemption_stress.h"

int main(int argc, char** argv) {
  using namespace beaconkv;
  stress::Options opts;
  opts.num_requests = 10000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--requests") && i + 1 < argc) {
      opts.num_requests = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      opts.seed = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (!std::strcmp(argv[i], "--no-verify")) {
      opts.verify_every_step = false;
    } else {
      std::fprintf(stderr, "usage: %s [--requests N] [--seed S] [--no-verify]\n", argv[0]);
      return 2;
    }
  }
  if (opts.num_requests < 1) {
    std::fprintf(stderr, "--requests must be >= 1\n");
    return 2;
  }
  std::printf("%d requests, seed %u, max_batch %d, pool %dx oversubscribed, VerifyIntegrity %s\n",
              opts.num_requests, opts.seed, opts.max_batch, opts.oversubscription,
              opts.verify_every_step ? "every step" : "off");
  std::printf("%-10s %-9s %7s %8s %10s %8s %8s %s\n", "policy", "mode", "blocks", "steps",
              "recompute", "swap", "seconds", "check");
  int failures = 0;
  for (const std::string& name : PolicyNames()) {
    const PolicyConfig config = stress::SmallPolicy(name);
    stress::Options free_opts = opts;
    free_opts.verify_every_step = false;
    const stress::Result ref = stress::Run(config, PreemptionMode::kSwap, free_opts, false);
    std::string ref_check = stress::CheckComplete(ref, opts);
    for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
      const auto start = std::chrono::steady_clock::now();
      const stress::Result r = stress::Run(config, mode, opts, true);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string check = stress::CheckComplete(r, opts);
      const bool exact_expected = mode == PreemptionMode::kSwap || name == "full";
      if (check.empty() && exact_expected)
        check = !ref_check.empty() ? "reference: " + ref_check : stress::CompareOutputs(r, ref);
      std::printf(
          "%-10s %-9s %7d %8lld %10lld %8lld %8.1f %s\n", name.c_str(),
          mode == PreemptionMode::kSwap ? "swap" : "recompute", r.num_blocks,
          static_cast<long long>(r.stats.steps),
          static_cast<long long>(r.stats.preemptions_recompute),
          static_cast<long long>(r.stats.preemptions_swap), seconds,
          check.empty() ? (exact_expected ? "ok, outputs = unconstrained" : "ok") : check.c_str());
      std::fflush(stdout);
      failures += !check.empty();
    }
  }
  std::printf("%s\n", failures == 0 ? "all runs passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
