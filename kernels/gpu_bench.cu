// Device benchmark for tests/gpu/run_device_checks.sh: segmented top-k against a full
// DeviceSegmentedSort, the cost of one compression event (scoring + top-k + compaction)
// against one decode step's paged attention, and paged attention bandwidth. Fixed seeds;
// every figure is a ratio against a baseline measured in the same run, and the two top-k
// paths are checked to agree on the benchmark data. Needs no CPU twin (builds with nvcc
// alone): gpu_bench --json PATH
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_segmented_sort.cuh>
#include <string>
#include <vector>

#include "kernels/compaction_moves.h"
#include "kernels/paged_attention.h"
#include "kernels/paged_attention_gqa.h"
#include "kernels/paged_scores.h"
#include "kernels/rope_rotate.h"
#include "kernels/segmented_topk.h"

namespace beaconkv::kernels {
namespace {

#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    const cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// Qwen3-4B attention geometry and BeaconKV's default compression settings.
constexpr int kLayers = 36, kKvHeads = 8, kQHeads = 32, kHeadDim = 128;
constexpr int kTokens = 2176;  // budget 2048 + interval 128: the length at compression
constexpr int kBudget = 2048, kInterval = 128, kRecent = 48, kBeacons = 256, kSinks = 4;
constexpr int kBlockSize = 16;
constexpr double kPeakBytesPerSecond = 4.8e12;  // H200 HBM3e

__device__ uint32_t Hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

__global__ void FillNormalish(float* x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // Sum of two uniforms: cheap, bounded, roughly bell-shaped.
    const float a = Hash(seed * 0x100000000ull + 2 * i) * 2.3283064e-10f;
    const float b = Hash(seed * 0x100000000ull + 2 * i + 1) * 2.3283064e-10f;
    x[i] = scale * (a + b - 1.0f);
  }
}

// Segments of equal length n: positions 0..n-1 (slot order), sinks and recent window
// protected, k = budget - protected.
__global__ void FillSegments(int32_t* positions, uint8_t* protect, int64_t items, int32_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < items;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t j = static_cast<int32_t>(i % n);
    positions[i] = j;
    protect[i] = (j < kSinks || j >= n - kRecent) ? 1 : 0;
  }
}

template <typename T>
T* Alloc(size_t count) {
  T* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  return p;
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* p = Alloc<T>(v.size());
  BENCH_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

void Fill(float* x, int64_t n, uint64_t seed, float scale) {
  FillNormalish<<<1024, 256>>>(x, n, seed, scale);
  BENCH_CHECK(cudaGetLastError());
}

// Median of `reps` timed runs of fn after one warm-up, in milliseconds.
template <typename Fn>
double TimeMs(int reps, Fn fn) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  fn();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    BENCH_CHECK(cudaEventRecord(a));
    fn();
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Results {
  std::vector<std::pair<std::string, std::string>> fields;  // JSON key, JSON value
  void Add(const std::string& key, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    fields.emplace_back(key, buf);
  }
  void AddBool(const std::string& key, bool v) { fields.emplace_back(key, v ? "true" : "false"); }
  void AddString(const std::string& key, const std::string& v) {
    fields.emplace_back(key, "\"" + v + "\"");
  }
};

// 1. Segmented top-k over 256 x 36 x 8 segments of 2,176 keys.
void BenchTopK(Results& res) {
  const int32_t segments = 256 * kLayers * kKvHeads, n = kTokens;
  const int64_t items = int64_t{segments} * n;
  std::printf("top-k: %d segments x %d keys\n", segments, n);
  std::vector<int32_t> offsets(segments + 1), k(segments, kBudget - kSinks - kRecent);
  for (int32_t s = 0; s <= segments; ++s) offsets[s] = s * n;
  int32_t* d_offsets = Upload(offsets);
  int32_t* d_k = Upload(k);
  float* scores = Alloc<float>(items);
  int32_t* positions = Alloc<int32_t>(items);
  uint8_t* protect = Alloc<uint8_t>(items);
  uint8_t* keep_block = Alloc<uint8_t>(items);
  uint8_t* keep_sort = Alloc<uint8_t>(items);
  Fill(scores, items, 1, 1.0f);
  FillSegments<<<1024, 256>>>(positions, protect, items, n);
  BENCH_CHECK(cudaGetLastError());
  SegmentedTopKShape shape;
  shape.num_segments = segments;
  shape.num_items = static_cast<int32_t>(items);
  shape.max_segment_len = n;
  size_t sort_bytes = 0, block_bytes = 0;
  BENCH_CHECK(SegmentedTopK(nullptr, &sort_bytes, d_offsets, scores, positions, protect, d_k, shape,
                            TopKAlgorithm::kSegmentedSort, keep_sort, nullptr));
  BENCH_CHECK(SegmentedTopK(nullptr, &block_bytes, d_offsets, scores, positions, protect, d_k,
                            shape, TopKAlgorithm::kBlockRadixSort, keep_block, nullptr));
  void* temp = Alloc<char>(std::max(sort_bytes, block_bytes));
  uint8_t* keep_select = Alloc<uint8_t>(items);
  const double block_ms = TimeMs(5, [&] {
    BENCH_CHECK(SegmentedTopK(temp, &block_bytes, d_offsets, scores, positions, protect, d_k, shape,
                              TopKAlgorithm::kBlockRadixSort, keep_block, nullptr));
  });
  const double select_ms = TimeMs(5, [&] {
    BENCH_CHECK(SegmentedTopK(temp, &block_bytes, d_offsets, scores, positions, protect, d_k, shape,
                              TopKAlgorithm::kBlockRadixSelect, keep_select, nullptr));
  });
  const double sort_path_ms = TimeMs(3, [&] {
    BENCH_CHECK(SegmentedTopK(temp, &sort_bytes, d_offsets, scores, positions, protect, d_k, shape,
                              TopKAlgorithm::kSegmentedSort, keep_sort, nullptr));
  });
  // Bare baseline: one DeviceSegmentedSort of (score, index) pairs, nothing else.
  float* sorted_scores = Alloc<float>(items);
  int32_t* idx_in = Alloc<int32_t>(items);
  int32_t* idx_out = Alloc<int32_t>(items);
  size_t bare_bytes = 0;
  BENCH_CHECK(cub::DeviceSegmentedSort::SortPairsDescending(nullptr, bare_bytes, scores,
                                                            sorted_scores, idx_in, idx_out, items,
                                                            segments, d_offsets, d_offsets + 1));
  void* bare_temp = Alloc<char>(bare_bytes);
  const double bare_ms = TimeMs(3, [&] {
    BENCH_CHECK(cub::DeviceSegmentedSort::SortPairsDescending(bare_temp, bare_bytes, scores,
                                                              sorted_scores, idx_in, idx_out, items,
                                                              segments, d_offsets, d_offsets + 1));
  });
  // With maxpool 7 (the pooling BeaconKV can turn on).
  shape.pooling = TopKPooling::kMax;
  shape.pool_kernel = 7;
  const double block_pool_ms = TimeMs(5, [&] {
    BENCH_CHECK(SegmentedTopK(temp, &block_bytes, d_offsets, scores, positions, protect, d_k, shape,
                              TopKAlgorithm::kBlockRadixSort, keep_block, nullptr));
  });
  const double select_pool_ms = TimeMs(5, [&] {
    BENCH_CHECK(SegmentedTopK(temp, &block_bytes, d_offsets, scores, positions, protect, d_k, shape,
                              TopKAlgorithm::kBlockRadixSelect, keep_select, nullptr));
  });
  int64_t pool_mismatches = 0;
  {
    BENCH_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> a(items), b(items);
    BENCH_CHECK(cudaMemcpy(a.data(), keep_block, items, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), keep_select, items, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < items; ++i) pool_mismatches += a[i] != b[i];
  }
  // Both paths must keep the same elements (checked on the unpooled run).
  shape.pooling = TopKPooling::kNone;
  shape.pool_kernel = 1;
  BENCH_CHECK(SegmentedTopK(temp, &block_bytes, d_offsets, scores, positions, protect, d_k, shape,
                            TopKAlgorithm::kBlockRadixSort, keep_block, nullptr));
  BENCH_CHECK(cudaDeviceSynchronize());
  BENCH_CHECK(SegmentedTopK(temp, &block_bytes, d_offsets, scores, positions, protect, d_k, shape,
                            TopKAlgorithm::kBlockRadixSelect, keep_select, nullptr));
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> a(items), b(items), c(items);
  BENCH_CHECK(cudaMemcpy(a.data(), keep_block, items, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(b.data(), keep_sort, items, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(c.data(), keep_select, items, cudaMemcpyDeviceToHost));
  int64_t mismatches = pool_mismatches, kept = 0;
  for (int64_t i = 0; i < items; ++i) {
    mismatches += (a[i] != b[i]) + (c[i] != b[i]);
    kept += c[i];
  }
  const bool kept_right = kept == int64_t{segments} * kBudget;
  // beacon's prompt_slots: a reserved region (a 400-token prompt after the sinks) whose best
  // 4 tokens each segment keeps first; the selection runs twice.
  std::vector<uint8_t> region_host(static_cast<size_t>(n), 0);
  for (int32_t j = kSinks; j < std::min(n, kSinks + 400); ++j) region_host[j] = 1;
  uint8_t* region = Alloc<uint8_t>(items);
  for (int32_t s = 0; s < segments; ++s) {
    BENCH_CHECK(cudaMemcpy(region + int64_t{s} * n, region_host.data(), n, cudaMemcpyHostToDevice));
  }
  int32_t* d_region_k = Upload(std::vector<int32_t>(segments, 4));
  SegmentedTopKShape reserved = shape;
  reserved.reserve = {region, d_region_k};
  size_t reserve_bytes = 0;
  BENCH_CHECK(SegmentedTopK(nullptr, &reserve_bytes, d_offsets, scores, positions, protect, d_k,
                            reserved, TopKAlgorithm::kBlockRadixSelect, keep_select, nullptr));
  void* reserve_temp = Alloc<char>(reserve_bytes);
  const double select_reserve_ms = TimeMs(5, [&] {
    BENCH_CHECK(SegmentedTopK(reserve_temp, &reserve_bytes, d_offsets, scores, positions, protect,
                              d_k, reserved, TopKAlgorithm::kBlockRadixSelect, keep_select,
                              nullptr));
  });
  BENCH_CHECK(cudaDeviceSynchronize());
  BENCH_CHECK(cudaMemcpy(c.data(), keep_select, items, cudaMemcpyDeviceToHost));
  int64_t reserve_kept = 0;
  for (int64_t i = 0; i < items; ++i) reserve_kept += c[i];
  const bool reserve_kept_right = reserve_kept == int64_t{segments} * kBudget;
  std::printf(
      "  with a reserved region (4 of a 400-token prompt): select %.3f ms (%.2fx the plain "
      "select); kept per segment = budget: %s\n",
      select_reserve_ms, select_reserve_ms / select_ms, reserve_kept_right ? "yes" : "NO");
  res.Add("topk_select_reserve_ms", select_reserve_ms);
  res.AddBool("topk_reserve_kept_equals_budget", reserve_kept_right);
  for (void* p : {(void*)region, (void*)d_region_k, reserve_temp}) BENCH_CHECK(cudaFree(p));
  std::printf(
      "  block radix select (the default) %.3f ms, block radix sort %.3f ms, segmented-sort "
      "path %.3f ms, bare DeviceSegmentedSort %.3f ms -> select %.2fx faster than the bare sort "
      "(target >= 3x; block sort %.2fx); max-pooled 7: select %.3f ms, sort %.3f ms; paths "
      "agree: %s (%lld mismatches), kept per segment = budget: %s\n",
      select_ms, block_ms, sort_path_ms, bare_ms, bare_ms / select_ms, bare_ms / block_ms,
      select_pool_ms, block_pool_ms, mismatches == 0 ? "yes" : "NO",
      static_cast<long long>(mismatches), kept_right ? "yes" : "NO");
  res.Add("topk_segments", segments);
  res.Add("topk_segment_len", n);
  res.Add("topk_select_ms", select_ms);
  res.Add("topk_select_maxpool7_ms", select_pool_ms);
  res.Add("topk_block_ms", block_ms);
  res.Add("topk_block_maxpool7_ms", block_pool_ms);
  res.Add("topk_segmented_sort_path_ms", sort_path_ms);
  res.Add("device_segmented_sort_ms", bare_ms);
  res.Add("topk_speedup_vs_device_segmented_sort", bare_ms / select_ms);
  res.Add("topk_block_sort_speedup_vs_device_segmented_sort", bare_ms / block_ms);
  res.AddBool("topk_paths_agree", mismatches == 0);
  res.AddBool("topk_kept_equals_budget", kept_right);
  for (void* p : {(void*)d_offsets, (void*)d_k, (void*)scores, (void*)positions, (void*)protect,
                  (void*)keep_block, (void*)keep_sort, (void*)keep_select, temp,
                  (void*)sorted_scores, (void*)idx_in, (void*)idx_out, bare_temp}) {
    BENCH_CHECK(cudaFree(p));
  }
}

// A paged cache of `rows` sequences x kKvHeads heads with kTokens tokens each, blocks in a
// scrambled order (one layer; every layer costs the same).
struct PagedCache {
  int32_t rows = 0, max_blocks = 0, num_blocks = 0;
  float *k = nullptr, *v = nullptr;
  int32_t *positions = nullptr, *tables = nullptr, *lengths = nullptr;
};

PagedCache MakeCache(int32_t rows, bool scrambled) {
  PagedCache c;
  c.rows = rows;
  c.max_blocks = (kTokens + kBlockSize - 1) / kBlockSize;
  const int32_t heads = rows * kKvHeads;
  c.num_blocks = heads * c.max_blocks;
  std::vector<int32_t> ids(c.num_blocks);
  for (int32_t i = 0; i < c.num_blocks; ++i) ids[i] = i;
  if (scrambled) {
    uint64_t x = 12345;
    for (int32_t i = c.num_blocks - 1; i > 0; --i) {  // Fisher-Yates with an LCG
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(ids[i], ids[(x >> 33) % (i + 1)]);
    }
  }
  c.tables = Upload(ids);  // [heads, max_blocks]
  c.lengths = Upload(std::vector<int32_t>(heads, kTokens));
  const int64_t floats = int64_t{c.num_blocks} * kBlockSize * kHeadDim;
  c.k = Alloc<float>(floats);
  c.v = Alloc<float>(floats);
  c.positions = Alloc<int32_t>(int64_t{c.num_blocks} * kBlockSize);
  Fill(c.k, floats, 2, 2.0f);
  Fill(c.v, floats, 3, 1.0f);
  return c;
}

void FreeCache(PagedCache& c) {
  for (void* p : {(void*)c.k, (void*)c.v, (void*)c.positions, (void*)c.tables, (void*)c.lengths})
    BENCH_CHECK(cudaFree(p));
}

// The attention shape of the benchmark cache `c`.
PagedAttentionShape ShapeOf(const PagedCache& c) {
  PagedAttentionShape s;
  s.rows = c.rows;
  s.num_heads = kQHeads;
  s.num_kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  s.block_size = kBlockSize;
  s.max_blocks = c.max_blocks;
  return s;
}

double AttentionMs(const PagedCache& c, float* q, float* out) {
  const PagedAttentionShape s = ShapeOf(c);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  return TimeMs(5, [&] {
    BENCH_CHECK(PagedDecodeAttention(q, c.k, c.v, c.tables, c.lengths, s, scale, out, nullptr));
  });
}

struct GqaRun {
  double ms = 0;
  int32_t splits = 0, blocks_per_sm = 0;
};
GqaRun GqaMs(const PagedCache& c, const void* k, const void* v, KvDtype dtype, float* q, float* out,
             int32_t num_sms, bool occupancy = true);

// 2. One compression event for 64 sequences (every head of one layer; x36 for the model)
// against one decode step's attention over the same layer.
void BenchCompression(Results& res, int32_t num_sms) {
  constexpr int32_t kRows = 64;
  const int32_t heads = kRows * kKvHeads;
  const int32_t group = kQHeads / kKvHeads;
  const int32_t queries_per_head = kRecent * group + kBeacons;  // group_size 1 rows
  std::printf("compression: %d sequences, %d heads per layer, %d observation queries each\n", kRows,
              heads, queries_per_head);
  PagedCache c = MakeCache(kRows, true);
  float* q = Alloc<float>(int64_t{kRows} * kQHeads * kHeadDim);
  float* out = Alloc<float>(int64_t{kRows} * kQHeads * kHeadDim);
  Fill(q, int64_t{kRows} * kQHeads * kHeadDim, 4, 1.0f);
  const double attention_ms = AttentionMs(c, q, out);
  const double gqa_attention_ms = GqaMs(c, c.k, c.v, KvDtype::kFloat32, q, out, num_sms).ms;

  // Scoring inputs: beacons (pre-RoPE) rotated to one position per sequence, then scored
  // with the recent queries.
  std::vector<int32_t> table_of_head(heads), query_offsets(heads + 1), score_offsets(heads + 1);
  for (int32_t h = 0; h < heads; ++h) table_of_head[h] = h;
  for (int32_t h = 0; h <= heads; ++h) {
    query_offsets[h] = h * queries_per_head;
    score_offsets[h] = h * kTokens;
  }
  int32_t* d_table_of_head = Upload(table_of_head);
  int32_t* d_query_offsets = Upload(query_offsets);
  int32_t* d_score_offsets = Upload(score_offsets);
  const int64_t query_floats = int64_t{heads} * queries_per_head * kHeadDim;
  float* queries = Alloc<float>(query_floats);
  Fill(queries, query_floats, 5, 1.0f);
  // Beacon rows: the last kBeacons rows of each head; table row = the head's sequence.
  std::vector<int32_t> beacon_table_row(heads * kBeacons);
  for (int32_t i = 0; i < heads * kBeacons; ++i) beacon_table_row[i] = i / kBeacons / kKvHeads;
  int32_t* d_beacon_row = Upload(beacon_table_row);
  float* angle_table = Alloc<float>(int64_t{kRows} * kHeadDim);
  Fill(angle_table, int64_t{kRows} * kHeadDim, 6, 1.0f);
  float* beacons = Alloc<float>(int64_t{heads} * kBeacons * kHeadDim);
  Fill(beacons, int64_t{heads} * kBeacons * kHeadDim, 7, 1.0f);
  float* scores = Alloc<float>(int64_t{heads} * kTokens);
  PagedScoresShape ss;
  ss.num_heads = heads;
  ss.head_dim = kHeadDim;
  ss.block_size = kBlockSize;
  ss.max_blocks = c.max_blocks;
  ss.group_size = 1;
  const double rope_ms = TimeMs(5, [&] {
    // In place, as the beacons are rotated before being copied into the query rows.
    BENCH_CHECK(RotateRows(beacons, d_beacon_row, angle_table, heads * kBeacons, kHeadDim, beacons,
                           nullptr));
  });
  // One block per head (max_queries unknown), then the heads' query chunks spread over
  // several blocks (what GpuScorer asks for); the second is the event's scoring time.
  const double score_one_block_ms = TimeMs(3, [&] {
    BENCH_CHECK(PagedAttentionScores(c.k, KvDtype::kFloat32, c.tables, c.lengths, d_table_of_head,
                                     queries, d_query_offsets, d_score_offsets, nullptr, ss, scores,
                                     nullptr));
  });
  std::vector<float> scores_one_block(int64_t{heads} * kTokens);
  BENCH_CHECK(cudaMemcpy(scores_one_block.data(), scores, scores_one_block.size() * sizeof(float),
                         cudaMemcpyDeviceToHost));
  ss.max_queries = queries_per_head;
  const double score_ms = TimeMs(3, [&] {
    BENCH_CHECK(PagedAttentionScores(c.k, KvDtype::kFloat32, c.tables, c.lengths, d_table_of_head,
                                     queries, d_query_offsets, d_score_offsets, nullptr, ss, scores,
                                     nullptr));
  });
  std::vector<float> scores_split(scores_one_block.size());
  BENCH_CHECK(cudaMemcpy(scores_split.data(), scores, scores_split.size() * sizeof(float),
                         cudaMemcpyDeviceToHost));
  const bool split_same = scores_split == scores_one_block;  // max over queries: exact
  // The register-softmax kernel (off by default until it has run here): its time, and its
  // largest relative difference from the kernel above.
  ss.register_softmax = true;
  const double score_register_ms = TimeMs(3, [&] {
    BENCH_CHECK(PagedAttentionScores(c.k, KvDtype::kFloat32, c.tables, c.lengths, d_table_of_head,
                                     queries, d_query_offsets, d_score_offsets, nullptr, ss, scores,
                                     nullptr));
  });
  ss.register_softmax = false;
  std::vector<float> scores_register(scores_split.size());
  BENCH_CHECK(cudaMemcpy(scores_register.data(), scores, scores_register.size() * sizeof(float),
                         cudaMemcpyDeviceToHost));
  double register_diff = 0;
  for (size_t i = 0; i < scores_register.size(); ++i) {
    const double want = scores_split[i];
    register_diff =
        std::max(register_diff, std::abs(scores_register[i] - want) / (1e-6 + std::abs(want)));
  }
  std::printf(
      "  scoring with the softmax statistics in registers: %.3f ms (%.2fx), largest "
      "relative difference %.2g\n",
      score_register_ms, score_ms / score_register_ms, register_diff);
  res.Add("scoring_register_softmax_ms_per_layer", score_register_ms);
  res.Add("scoring_register_softmax_max_rel_diff", register_diff);
  std::printf(
      "  scoring: %.3f ms with one block per head, %.3f ms spread over blocks (%.2fx), "
      "same scores: %s\n",
      score_one_block_ms, score_ms, score_one_block_ms / score_ms, split_same ? "yes" : "NO");
  res.Add("scoring_one_block_per_head_ms_per_layer", score_one_block_ms);
  res.AddBool("scoring_split_same_scores", split_same);
  // Top-k over the scores just computed.
  int32_t* positions = Alloc<int32_t>(int64_t{heads} * kTokens);
  uint8_t* protect = Alloc<uint8_t>(int64_t{heads} * kTokens);
  uint8_t* keep = Alloc<uint8_t>(int64_t{heads} * kTokens);
  FillSegments<<<1024, 256>>>(positions, protect, int64_t{heads} * kTokens, kTokens);
  BENCH_CHECK(cudaGetLastError());
  int32_t* d_k = Upload(std::vector<int32_t>(heads, kBudget - kSinks - kRecent));
  SegmentedTopKShape ts;
  ts.num_segments = heads;
  ts.num_items = heads * kTokens;
  ts.max_segment_len = kTokens;
  size_t temp_bytes = 0;
  BENCH_CHECK(SegmentedTopK(nullptr, &temp_bytes, d_score_offsets, scores, positions, protect, d_k,
                            ts, TopKAlgorithm::kAuto, keep, nullptr));
  void* temp = Alloc<char>(temp_bytes);
  const double topk_ms = TimeMs(5, [&] {
    BENCH_CHECK(SegmentedTopK(temp, &temp_bytes, d_score_offsets, scores, positions, protect, d_k,
                              ts, TopKAlgorithm::kAuto, keep, nullptr));
  });
  // Compaction from the keep mask just computed: moves planned on the device, then applied.
  const int64_t items = int64_t{heads} * kTokens;
  int32_t* from = Alloc<int32_t>(items);
  int32_t* to = Alloc<int32_t>(items);
  int32_t* num_moves = Alloc<int32_t>(heads);
  int32_t* new_lengths = Alloc<int32_t>(heads);
  CompactionShape cs;
  cs.num_segments = heads;
  cs.num_items = static_cast<int32_t>(items);
  cs.block_size = kBlockSize;
  cs.max_blocks = c.max_blocks;
  const double plan_ms = TimeMs(5, [&] {
    BENCH_CHECK(CompactionMoves(d_score_offsets, keep, d_table_of_head, c.tables, cs, from, to,
                                num_moves, new_lengths, nullptr));
  });
  const double apply_ms = TimeMs(5, [&] {
    BENCH_CHECK(ApplyCompactionMoves(d_score_offsets, from, to, num_moves, heads, c.k, c.v,
                                     KvDtype::kFloat32, c.positions, kHeadDim, nullptr));
  });
  std::vector<int32_t> moves_host(heads), lengths_host(heads);
  BENCH_CHECK(
      cudaMemcpy(moves_host.data(), num_moves, heads * sizeof(int32_t), cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(lengths_host.data(), new_lengths, heads * sizeof(int32_t),
                         cudaMemcpyDeviceToHost));
  int64_t total_moves = 0;
  bool lengths_right = true;
  for (int32_t h = 0; h < heads; ++h) {
    total_moves += moves_host[h];
    lengths_right = lengths_right && lengths_host[h] == kBudget;
  }
  const double compact_ms = plan_ms + apply_ms;
  std::printf(
      "  compaction: %lld moves (plan %.3f ms, apply %.3f ms); every head keeps the "
      "budget: %s\n",
      static_cast<long long>(total_moves), plan_ms, apply_ms, lengths_right ? "yes" : "NO");
  res.Add("compaction_moves", static_cast<double>(total_moves));
  res.AddBool("compaction_lengths_equal_budget", lengths_right);
  const double event_ms = rope_ms + score_ms + topk_ms + compact_ms;
  const double share = event_ms / attention_ms;
  std::printf(
      "  per layer: attention %.3f ms; rope %.3f + scoring %.3f + top-k %.3f + "
      "compaction %.3f = %.3f ms -> %.1f%% of one step, %.2f%% amortised over the "
      "%d-step interval (target <= 5%%)\n",
      attention_ms, rope_ms, score_ms, topk_ms, compact_ms, event_ms, 100 * share,
      100 * share / kInterval, kInterval);
  res.Add("compression_rows", kRows);
  res.Add("compression_queries_per_head", queries_per_head);
  res.Add("decode_attention_ms_per_layer", attention_ms);
  res.Add("rope_ms_per_layer", rope_ms);
  res.Add("scoring_ms_per_layer", score_ms);
  res.Add("topk_ms_per_layer", topk_ms);
  res.Add("compaction_ms_per_layer", compact_ms);
  res.Add("compression_event_ms_model", event_ms * kLayers);
  res.Add("decode_attention_ms_model", attention_ms * kLayers);
  res.Add("compression_share_of_step", share);
  res.Add("compression_share_amortised", share / kInterval);
  res.Add("decode_attention_gqa_fp32_ms_per_layer", gqa_attention_ms);
  res.Add("compression_share_amortised_vs_gqa_fp32", event_ms / gqa_attention_ms / kInterval);
  std::printf("  against the GQA fp32 attention kernel (%.3f ms): %.2f%% amortised\n",
              gqa_attention_ms, 100 * event_ms / gqa_attention_ms / kInterval);
  for (void* p : {(void*)q, (void*)out, (void*)d_table_of_head, (void*)d_query_offsets,
                  (void*)d_score_offsets, (void*)queries, (void*)d_beacon_row, (void*)angle_table,
                  (void*)beacons, (void*)scores, (void*)positions, (void*)protect, (void*)keep,
                  (void*)d_k, temp, (void*)from, (void*)to, (void*)num_moves, (void*)new_lengths}) {
    BENCH_CHECK(cudaFree(p));
  }
  FreeCache(c);
}

__global__ void ToBf16(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16_rn(x[i]);
  }
}

// The GQA kernel on cache `c` (fp32) or its bf16 copy. Splits: ChooseNumSplits with the
// kernel's occupancy (GqaBlocksPerSm), or with the old assumption of two blocks per SM.
GqaRun GqaMs(const PagedCache& c, const void* k, const void* v, KvDtype dtype, float* q, float* out,
             int32_t num_sms, bool occupancy) {
  const PagedAttentionShape s = ShapeOf(c);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  GqaRun run;
  run.blocks_per_sm = 2;
  if (occupancy) BENCH_CHECK(GqaBlocksPerSm(s, dtype, &run.blocks_per_sm));
  run.splits = ChooseNumSplits(s, num_sms, run.blocks_per_sm);
  size_t bytes = 0;
  BENCH_CHECK(PagedDecodeAttentionGqa(nullptr, &bytes, q, k, v, dtype, c.tables, c.lengths, s,
                                      scale, run.splits, out, nullptr));
  void* work = Alloc<char>(bytes);
  run.ms = TimeMs(5, [&] {
    BENCH_CHECK(PagedDecodeAttentionGqa(work, &bytes, q, k, v, dtype, c.tables, c.lengths, s, scale,
                                        run.splits, out, nullptr));
  });
  BENCH_CHECK(cudaFree(work));
  return run;
}

// 3. Paged decode attention bandwidth at several batch sizes: the first kernel (fp32, one
// block per query head), the GQA kernel on fp32 and on bf16 storage, and the GQA bf16 kernel
// on contiguous blocks (identity block tables). Also checks that the GQA kernel's fp32
// output matches the first kernel's.
void BenchAttentionBandwidth(Results& res, int32_t num_sms) {
  for (int32_t rows : {1, 16, 64, 256}) {
    const int64_t qn = int64_t{rows} * kQHeads * kHeadDim;
    float* q = Alloc<float>(qn);
    float* out_a = Alloc<float>(qn);
    float* out_b = Alloc<float>(qn);
    Fill(q, qn, 8, 1.0f);
    double ms_first = 0, ms_bf16_contiguous = 0;
    GqaRun fp32, bf16, fp32_two, bf16_two;  // *_two: splits for two blocks per SM
    float max_diff = 0.0f;
    for (int layout = 0; layout < 2; ++layout) {
      PagedCache c = MakeCache(rows, layout == 0);
      const int64_t floats = int64_t{c.num_blocks} * kBlockSize * kHeadDim;
      __nv_bfloat16* kb = Alloc<__nv_bfloat16>(floats);
      __nv_bfloat16* vb = Alloc<__nv_bfloat16>(floats);
      ToBf16<<<1024, 256>>>(c.k, kb, floats);
      ToBf16<<<1024, 256>>>(c.v, vb, floats);
      BENCH_CHECK(cudaGetLastError());
      if (layout == 0) {
        ms_first = AttentionMs(c, q, out_a);
        fp32_two = GqaMs(c, c.k, c.v, KvDtype::kFloat32, q, out_b, num_sms, false);
        fp32 = GqaMs(c, c.k, c.v, KvDtype::kFloat32, q, out_b, num_sms);
        std::vector<float> a(qn), b(qn);
        BENCH_CHECK(cudaMemcpy(a.data(), out_a, qn * sizeof(float), cudaMemcpyDeviceToHost));
        BENCH_CHECK(cudaMemcpy(b.data(), out_b, qn * sizeof(float), cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < qn; ++i) max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
        bf16_two = GqaMs(c, kb, vb, KvDtype::kBFloat16, q, out_b, num_sms, false);
        bf16 = GqaMs(c, kb, vb, KvDtype::kBFloat16, q, out_b, num_sms);
      } else {
        ms_bf16_contiguous = GqaMs(c, kb, vb, KvDtype::kBFloat16, q, out_b, num_sms).ms;
      }
      BENCH_CHECK(cudaFree(kb));
      BENCH_CHECK(cudaFree(vb));
      FreeCache(c);
    }
    BENCH_CHECK(cudaFree(q));
    BENCH_CHECK(cudaFree(out_a));
    BENCH_CHECK(cudaFree(out_b));
    // Bytes a step must read at least: K and V of every head once.
    const double elems = 2.0 * rows * kKvHeads * kTokens * kHeadDim;
    const double bw_first = elems * 4 / (ms_first * 1e-3);
    const double bw_fp32 = elems * 4 / (fp32.ms * 1e-3);
    const double bw_bf16 = elems * 2 / (bf16.ms * 1e-3);
    std::printf(
        "attention batch %3d: first kernel %.3f ms (%.1f%% of 4.8 TB/s); GQA fp32 %.3f "
        "ms (%.1f%%; %d splits at %d blocks/SM, %.3f ms with %d for two); GQA bf16 %.3f ms "
        "(%.1f%%; %d splits at %d blocks/SM, %.3f ms with %d for two), contiguous %.3f ms; "
        "|GQA fp32 - first| <= %.2g\n",
        rows, ms_first, 100 * bw_first / kPeakBytesPerSecond, fp32.ms,
        100 * bw_fp32 / kPeakBytesPerSecond, fp32.splits, fp32.blocks_per_sm, fp32_two.ms,
        fp32_two.splits, bf16.ms, 100 * bw_bf16 / kPeakBytesPerSecond, bf16.splits,
        bf16.blocks_per_sm, bf16_two.ms, bf16_two.splits, ms_bf16_contiguous, max_diff);
    const std::string key = "attention_b" + std::to_string(rows);
    res.Add(key + "_first_kernel_ms", ms_first);
    res.Add(key + "_first_kernel_peak_fraction", bw_first / kPeakBytesPerSecond);
    res.Add(key + "_gqa_fp32_ms", fp32.ms);
    res.Add(key + "_gqa_fp32_splits", fp32.splits);
    res.Add(key + "_gqa_fp32_blocks_per_sm", fp32.blocks_per_sm);
    res.Add(key + "_gqa_fp32_ms_two_blocks_rule", fp32_two.ms);
    res.Add(key + "_gqa_fp32_peak_fraction", bw_fp32 / kPeakBytesPerSecond);
    res.Add(key + "_gqa_bf16_ms", bf16.ms);
    res.Add(key + "_gqa_bf16_splits", bf16.splits);
    res.Add(key + "_gqa_bf16_blocks_per_sm", bf16.blocks_per_sm);
    res.Add(key + "_gqa_bf16_ms_two_blocks_rule", bf16_two.ms);
    res.Add(key + "_gqa_bf16_peak_fraction", bw_bf16 / kPeakBytesPerSecond);
    res.Add(key + "_gqa_bf16_contiguous_ms", ms_bf16_contiguous);
    res.Add(key + "_gqa_fp32_max_abs_diff_vs_first", max_diff);
    res.AddBool(key + "_gqa_fp32_agrees", max_diff <= 1e-4f);
  }
}

}  // namespace
}  // namespace beaconkv::kernels

int main(int argc, char** argv) {
  using namespace beaconkv::kernels;
  const char* json_path = nullptr;
  std::string only;  // --only topk|compression|attention: one part (e.g. under a profiler)
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) json_path = argv[i + 1];
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  if (!only.empty() && only != "topk" && only != "compression" && only != "attention") {
    std::fprintf(stderr, "gpu_bench: --only takes topk, compression or attention, not '%s'\n",
                 only.c_str());
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gpu_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  Results res;
  res.AddString("device", prop.name);
  if (only.empty() || only == "topk") BenchTopK(res);
  if (only.empty() || only == "compression") BenchCompression(res, prop.multiProcessorCount);
  if (only.empty() || only == "attention") BenchAttentionBandwidth(res, prop.multiProcessorCount);
  if (json_path != nullptr) {
    FILE* f = std::fopen(json_path, "w");
    if (f == nullptr) {
      std::perror(json_path);
      return 1;
    }
    std::fprintf(f, "{\n");
    for (size_t i = 0; i < res.fields.size(); ++i) {
      std::fprintf(f, "  \"%s\": %s%s\n", res.fields[i].first.c_str(), res.fields[i].second.c_str(),
                   i + 1 < res.fields.size() ? "," : "");
    }
    std::fprintf(f, "}\n");
    std::fclose(f);
  }
  return 0;
}
