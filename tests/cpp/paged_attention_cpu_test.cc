// The CPU paged decode attention (the engine's and the vLLM backend's decode path, and the CUDA
// kernel's twin) against a double-precision reference on gathered keys, for every head size
// path (explicit AVX-512 / AVX2 dot products for multiples of 16 / 8, portable otherwise).
#include "kernels/paged_attention_cpu.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

namespace beaconkv::kernels {
namespace {

struct Case {
  std::vector<float> q, k, v;
  std::vector<int32_t> tables, lengths;
  PagedAttentionShape s;
};

// Rows with the given kv-head lengths; each head's blocks are scattered over the cache in a
// shuffled order, so the test follows the table rather than memory order.
Case MakeCase(int32_t rows, int32_t heads, int32_t kv_heads, int32_t d, int32_t bs,
              std::mt19937& rng) {
  Case c;
  c.s = {rows, heads, kv_heads, d, bs, 0};
  std::uniform_int_distribution<int32_t> len(1, 70);
  for (int32_t i = 0; i < rows * kv_heads; ++i) c.lengths.push_back(len(rng));
  const int32_t max_len = *std::max_element(c.lengths.begin(), c.lengths.end());
  c.s.max_blocks = (max_len + bs - 1) / bs;
  const int32_t num_blocks = rows * kv_heads * c.s.max_blocks;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tables = ids;  // [rows, kv_heads, max_blocks]
  std::normal_distribution<float> normal(0.0f, 1.0f);
  c.q.resize(static_cast<size_t>(rows) * heads * d);
  c.k.resize(static_cast<size_t>(num_blocks) * bs * d);
  c.v.resize(c.k.size());
  for (float& x : c.q) x = normal(rng);
  for (float& x : c.k) x = normal(rng);
  for (float& x : c.v) x = normal(rng);
  return c;
}

std::vector<float> Attend(const Case& c, float scale, int threads,
                          const std::vector<float>* bias = nullptr) {
  std::vector<float> out(c.q.size(), -7.0f);
  PagedDecodeAttentionCpu(c.q.data(), c.k.data(), c.v.data(), c.tables.data(), c.lengths.data(),
                          c.s, scale, out.data(), threads,
                          bias != nullptr ? bias->data() : nullptr);
  return out;
}

// bias: [rows, kv_heads, max_blocks * block_size] logit terms in logical slot order, or null.
std::vector<double> Reference(const Case& c, float scale,
                              const std::vector<float>* bias = nullptr) {
  const auto& s = c.s;
  const int32_t group = s.num_heads / s.num_kv_heads;
  std::vector<double> out(c.q.size());
  for (int32_t b = 0; b < s.rows; ++b) {
    for (int32_t h = 0; h < s.num_heads; ++h) {
      const int32_t head = b * s.num_kv_heads + h / group;
      const int32_t n = c.lengths[head];
      auto slot = [&](const std::vector<float>& cache, int32_t j) {
        const int32_t block = c.tables[static_cast<size_t>(head) * s.max_blocks + j / s.block_size];
        return &cache[(static_cast<size_t>(block) * s.block_size + j % s.block_size) * s.head_dim];
      };
      const float* q = &c.q[(static_cast<size_t>(b) * s.num_heads + h) * s.head_dim];
      std::vector<double> logit(n);
      for (int32_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int32_t e = 0; e < s.head_dim; ++e) dot += double(q[e]) * slot(c.k, j)[e];
        logit[j] = dot * scale;
        if (bias != nullptr)
          logit[j] += (*bias)[static_cast<size_t>(head) * s.max_blocks * s.block_size + j];
      }
      const double mx = *std::max_element(logit.begin(), logit.end());
      double z = 0;
      for (double& x : logit) z += (x = std::exp(x - mx));
      for (int32_t e = 0; e < s.head_dim; ++e) {
        double acc = 0;
        for (int32_t j = 0; j < n; ++j) acc += logit[j] / z * slot(c.v, j)[e];
        out[(static_cast<size_t>(b) * s.num_heads + h) * s.head_dim + e] = acc;
      }
    }
  }
  return out;
}

TEST(PagedDecodeAttentionCpuTest, MatchesTheReferenceForEveryHeadSizePath) {
  std::mt19937 rng(17);
  // head_dim 32/64/128 (fixed-size paths), 48 (AVX-512 loop), 24 (AVX2 only), 20 (portable).
  for (const auto& [heads, kv_heads, d, bs] :
       {std::tuple{4, 2, 32, 16}, std::tuple{8, 2, 64, 5}, std::tuple{4, 4, 128, 1},
        std::tuple{8, 1, 48, 16}, std::tuple{4, 2, 24, 3}, std::tuple{2, 1, 20, 8}}) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << heads << " kv " << kv_heads << " d " << d << " block " << bs);
    const Case c = MakeCase(/*rows=*/5, heads, kv_heads, d, bs, rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const std::vector<float> got = Attend(c, scale, 1);
    const std::vector<double> want = Reference(c, scale);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << "element " << i;
    EXPECT_EQ(Attend(c, scale, 2), got) << "the thread count changed the result";
  }
}

TEST(PagedDecodeAttentionCpuTest, ABiasIsAddedToEachSlotsLogit) {
  std::mt19937 rng(29);
  for (const auto& [heads, kv_heads, d, bs] :
       {std::tuple{4, 2, 32, 16}, std::tuple{8, 2, 64, 5}, std::tuple{2, 1, 20, 8}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << heads << " d " << d << " block " << bs);
    const Case c = MakeCase(/*rows=*/4, heads, kv_heads, d, bs, rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> bias(static_cast<size_t>(c.s.rows) * kv_heads * c.s.max_blocks * bs);
    std::uniform_real_distribution<float> u(0.0f, 3.0f);
    for (float& x : bias) x = u(rng);
    const std::vector<float> got = Attend(c, scale, 1, &bias);
    const std::vector<double> want = Reference(c, scale, &bias);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << "element " << i;
    EXPECT_EQ(Attend(c, scale, 2, &bias), got) << "the thread count changed the result";
    // The bias moves the output; an all-zero one does not.
    const std::vector<double> plain = Reference(c, scale);
    double moved = 0;
    for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, std::abs(got[i] - plain[i]));
    EXPECT_GT(moved, 1e-2);
    const std::vector<float> zero(bias.size(), 0.0f);
    EXPECT_EQ(Attend(c, scale, 1, &zero), Attend(c, scale, 1));
  }
}

// A slot with bias log(m) weighs as m copies of itself: the count bias's premise.
TEST(PagedDecodeAttentionCpuTest, ABiasOfLogMWeighsAsMCopies) {
  std::mt19937 rng(5);
  Case a = MakeCase(/*rows=*/1, 2, 1, 32, /*bs=*/4, rng);
  a.lengths = {3};
  a.s.max_blocks = 2;
  a.tables = {0, 1};
  a.k.resize(std::max<size_t>(a.k.size(), 8 * 32), 0.5f);  // two blocks of 4 slots
  a.v.resize(a.k.size(), -0.5f);
  Case b = a;  // slots 0, 1, 2 and two copies of slot 1 (slots 3, 4)
  b.lengths = {5};
  for (int32_t copy : {3, 4}) {
    std::copy_n(&a.k[1 * 32], 32, &b.k[static_cast<size_t>(copy) * 32]);
    std::copy_n(&a.v[1 * 32], 32, &b.v[static_cast<size_t>(copy) * 32]);
  }
  std::vector<float> bias(8, 0.0f);
  bias[1] = std::log(3.0f);
  const std::vector<float> weighted = Attend(a, 0.3f, 1, &bias), copies = Attend(b, 0.3f, 1);
  for (size_t i = 0; i < weighted.size(); ++i) EXPECT_NEAR(weighted[i], copies[i], 1e-5);
}

TEST(PagedDecodeAttentionCpuTest, TheBlockSizeDoesNotChangeTheResult) {
  std::mt19937 rng(3);
  Case a = MakeCase(/*rows=*/3, 4, 2, 32, /*bs=*/16, rng);
  // The same slots in logical order, re-laid out as blocks of 1 token in identity order.
  Case b = a;
  b.s.block_size = 1;
  b.s.max_blocks = a.s.max_blocks * a.s.block_size;
  b.tables.assign(static_cast<size_t>(a.s.rows) * a.s.num_kv_heads * b.s.max_blocks, 0);
  b.k.assign(b.tables.size() * a.s.head_dim, 0.0f);
  b.v.assign(b.k.size(), 0.0f);
  for (int32_t head = 0; head < a.s.rows * a.s.num_kv_heads; ++head) {
    for (int32_t j = 0; j < a.lengths[head]; ++j) {
      const int32_t src_block = a.tables[static_cast<size_t>(head) * a.s.max_blocks + j / 16];
      const size_t src = (static_cast<size_t>(src_block) * 16 + j % 16) * a.s.head_dim;
      const int32_t dst_block = head * b.s.max_blocks + j;
      b.tables[static_cast<size_t>(head) * b.s.max_blocks + j] = dst_block;
      std::copy_n(&a.k[src], a.s.head_dim, &b.k[static_cast<size_t>(dst_block) * a.s.head_dim]);
      std::copy_n(&a.v[src], a.s.head_dim, &b.v[static_cast<size_t>(dst_block) * a.s.head_dim]);
    }
  }
  EXPECT_EQ(Attend(a, 0.2f, 1), Attend(b, 0.2f, 1));
}

// head_done follows each head's attention exactly once, with that head's output already
// final, inside the attention's region (its team) when the work is split and on the caller's
// thread otherwise; the output is the same either way.
TEST(PagedDecodeAttentionCpuTest, HeadDoneFollowsEachHeadOnce) {
  std::mt19937 rng(41);
  const Case big = MakeCase(/*rows=*/96, 4, 2, 32, /*bs=*/16, rng);
  const Case small = MakeCase(/*rows=*/2, 4, 2, 32, /*bs=*/16, rng);
  ASSERT_TRUE(PagedDecodeAttentionSplits(big.lengths.data(), big.s, 2));
  EXPECT_FALSE(PagedDecodeAttentionSplits(big.lengths.data(), big.s, 1));
  EXPECT_FALSE(PagedDecodeAttentionSplits(small.lengths.data(), small.s, 2));
  const float scale = 0.25f;
  for (const Case* c : {&big, &small}) {
    for (const int threads : {1, 2}) {
      const bool split = PagedDecodeAttentionSplits(c->lengths.data(), c->s, threads);
      SCOPED_TRACE(::testing::Message() << "rows " << c->s.rows << " threads " << threads);
      const std::vector<float> want = Attend(*c, scale, 1);
      const int32_t heads = c->s.rows * c->s.num_kv_heads;
      const int64_t head_floats = int64_t{c->s.num_heads / c->s.num_kv_heads} * c->s.head_dim;
      std::vector<float> out(c->q.size(), -7.0f);
      std::vector<std::atomic<int32_t>> calls(heads);
      std::vector<uint8_t> final_when_called(heads, 0);
      std::vector<int32_t> team(heads, 0);  // the team size each call ran in
      const std::function<void(int32_t, int32_t)> done = [&](int32_t b, int32_t g) {
        const int32_t head = b * c->s.num_kv_heads + g;
        ++calls[head];
        final_when_called[head] =
            std::equal(out.begin() + head * head_floats, out.begin() + (head + 1) * head_floats,
                       want.begin() + head * head_floats);
        team[head] = omp_get_num_threads();
      };
      const int ran_on = PagedDecodeAttentionCpu(c->q.data(), c->k.data(), c->v.data(),
                                                 c->tables.data(), c->lengths.data(), c->s, scale,
                                                 out.data(), threads, nullptr, &done);
      // (The runtime may give a split region fewer threads than asked: OMP_THREAD_LIMIT.)
      EXPECT_GE(ran_on, 1);
      EXPECT_LE(ran_on, split ? threads : 1);
      EXPECT_EQ(out, want);
      for (int32_t h = 0; h < heads; ++h) {
        EXPECT_EQ(calls[h].load(), 1) << "head " << h;
        EXPECT_TRUE(final_when_called[h]) << "head " << h << " called before its output";
        // Inside the attention's region when it is split, not in a loop after it.
        EXPECT_EQ(team[h], ran_on) << "head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace beaconkv::kernels
