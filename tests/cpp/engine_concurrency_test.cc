// The thread-safety contract of Engine: calls from several threads are serialized by the
// engine's mutex, so two threads stepping one engine while a third adds requests finish every
// request exactly once, with the same outputs as a single-threaded run.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "tests/cpp/random_model.h"

namespace beaconkv {
namespace {

Request MakeRequest(int64_t id) {
  Request r;
  r.id = id;
  for (int32_t t = 0; t < 3 + id % 7; ++t) r.prompt.push_back(1 + (id * 5 + t * 3) % 21);
  r.sampling.max_new_tokens = 12 + id % 9;
  r.sampling.ignore_eos = true;
  return r;
}

EngineConfig Config() {
  EngineConfig c;
  c.max_batch = 4;
  c.num_blocks = 1 + 40;  // tight: preemption happens
  c.num_threads = 1;
  c.verify_integrity = true;
  return c;
}

TEST(EngineConcurrencyTest, StepsFromTwoThreadsMatchOneThread) {
  constexpr int kRequests = 24;
  std::map<int64_t, std::vector<int32_t>> expected;
  {
    auto e = Engine::Create(test_model::RandomModel(3), Config());
    ASSERT_TRUE(e.ok()) << e.status();
    for (int64_t i = 0; i < kRequests; ++i) ASSERT_TRUE((*e)->AddRequest(MakeRequest(i)).ok());
    auto outs = (*e)->RunToCompletion();
    ASSERT_TRUE(outs.ok()) << outs.status();
    for (const RequestOutput& o : *outs) expected[o.id] = o.output;
  }
  auto e = Engine::Create(test_model::RandomModel(3), Config());
  ASSERT_TRUE(e.ok()) << e.status();
  Engine& engine = **e;
  for (int64_t i = 0; i < kRequests / 2; ++i) ASSERT_TRUE(engine.AddRequest(MakeRequest(i)).ok());
  std::mutex mu;
  std::map<int64_t, std::vector<int32_t>> got;
  std::vector<std::string> errors;
  std::atomic<bool> adding_done{false};
  auto stepper = [&] {
    while (!adding_done.load() || engine.HasUnfinished()) {
      std::vector<RequestOutput> done;
      absl::Status s = engine.Step(&done);
      const std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) {
        errors.push_back(s.ToString());
        return;
      }
      for (RequestOutput& o : done) {
        if (!got.emplace(o.id, o.output).second)
          errors.push_back("request " + std::to_string(o.id) + " finished twice");
      }
    }
  };
  std::thread a(stepper), b(stepper);
  std::thread adder([&] {
    for (int64_t i = kRequests / 2; i < kRequests; ++i) {
      absl::Status s = engine.AddRequest(MakeRequest(i));
      if (!s.ok()) {
        const std::lock_guard<std::mutex> lock(mu);
        errors.push_back(s.ToString());
      }
    }
    adding_done.store(true);
  });
  adder.join();
  a.join();
  b.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(engine.block_manager().NumFreeBlocks(), engine.block_manager().NumUsableBlocks());
  // Interleaving changes which requests share a batch, and greedy outputs do not depend on
  // the batch: every output equals the single-threaded one.
  for (const auto& [id, out] : expected) EXPECT_EQ(got[id], out) << "request " << id;
}

}  // namespace
}  // namespace beaconkv
