#include "engine/compress_step.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <utility>

#include "core/check.h"
#include "core/status_macros.h"

namespace beaconkv {
namespace {

// Each layer's kv_heads due under the policy ([num_layers], empty where none), from every
// head's retained count read under one lock (the engine asks this of every running sequence
// at every step; one lock and lookup per sequence rather than per head).
absl::StatusOr<std::vector<std::vector<int32_t>>> DueByLayer(const BlockManager& bm,
                                                             PolicyState& policy, SequenceId id) {
  const KvShape& shape = bm.shape();
  std::vector<int32_t> tokens(shape.num_heads_total());
  BKV_RETURN_IF_ERROR(bm.RetainedTokensOfHeads(id, absl::MakeSpan(tokens)));
  std::vector<std::vector<int32_t>> due(shape.num_layers);
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    due[l] =
        policy.DueHeads(l, absl::MakeConstSpan(tokens).subspan(
                               static_cast<size_t>(l) * shape.num_kv_heads, shape.num_kv_heads));
  }
  return due;
}

// Compress on the gathered keys of `layer`: of every head, or only of the due ones when the
// policy compresses its heads one by one (the others are not read then).
absl::StatusOr<std::vector<KeepSet>> HostLayer(const BlockManager& bm, const CpuKvStore& store,
                                               PolicyState& policy, SequenceId id, int32_t layer,
                                               absl::Span<const int32_t> due, int32_t current) {
  const int32_t kv_heads = bm.shape().num_kv_heads;
  const bool only_due = policy.HeadsConcurrent();
  std::vector<std::vector<float>> keys(kv_heads);
  std::vector<std::vector<int32_t>> positions(kv_heads);
  std::vector<HeadKeys> heads(kv_heads);
  for (int32_t h = 0; h < kv_heads; ++h) {
    if (only_due && std::find(due.begin(), due.end(), h) == due.end()) continue;
    heads[h] = GatherHead(bm, store, id, layer, h, &keys[h], &positions[h]);
  }
  return policy.Compress(layer, heads, due, current);
}

// One target's due layers compressed in turn: HostKeepSets on one thread.
absl::StatusOr<std::vector<KeepSet>> InTurn(const BlockManager& bm, const CpuKvStore& store,
                                            const CompressTarget& target) {
  std::vector<KeepSet> out;
  BKV_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> due_by_layer,
                       DueByLayer(bm, *target.policy, target.id));
  for (int32_t l = 0; l < bm.shape().num_layers; ++l) {
    const std::vector<int32_t>& due = due_by_layer[l];
    if (due.empty()) continue;
    BKV_ASSIGN_OR_RETURN(std::vector<KeepSet> sets, HostLayer(bm, store, *target.policy, target.id,
                                                              l, due, target.current_position));
    out.insert(out.end(), std::make_move_iterator(sets.begin()),
               std::make_move_iterator(sets.end()));
  }
  return out;
}

}  // namespace

HeadKeys GatherHead(const BlockManager& bm, const CpuKvStore& store, SequenceId id, int32_t layer,
                    int32_t kv_head, std::vector<float>* keys, std::vector<int32_t>* positions) {
  const int32_t n = BKV_CHECK_VALUE(bm.RetainedTokens(id, layer, kv_head));
  const int32_t d = store.head_dim(), bs = store.block_size();
  if (keys != nullptr) keys->resize(static_cast<size_t>(n) * d);
  positions->resize(n);
  const absl::Span<const BlockId> table = BKV_CHECK_VALUE(bm.BlockTable(id, layer, kv_head));
  for (int32_t j = 0; j < n; ++j) {
    const SlotRef slot{table[j / bs], j % bs};
    if (keys != nullptr) std::copy_n(store.key(slot), d, keys->data() + static_cast<size_t>(j) * d);
    (*positions)[j] = store.position(slot);
  }
  return HeadKeys{keys != nullptr ? keys->data() : nullptr, positions->data(), n};
}

std::vector<absl::StatusOr<std::vector<KeepSet>>> HostKeepSets(
    const BlockManager& bm, const CpuKvStore& store, absl::Span<const CompressTarget> targets,
    int num_threads) {
  const size_t num_targets = targets.size();
  std::vector<absl::StatusOr<std::vector<KeepSet>>> out(num_targets, std::vector<KeepSet>{});
  if (num_threads <= 1) {
    for (size_t t = 0; t < num_targets; ++t) out[t] = InTurn(bm, store, targets[t]);
    return out;
  }
  // The tasks: a target whose policy's layers do not compress concurrently is one (its layers
  // in turn), when a layer is due; otherwise each due layer is one, or each due head
  // (HeadsConcurrent: a layer 0 of copies is cheap, so four layers split unevenly over two
  // threads, eight heads less so). All targets' tasks share one region: a step's compressing
  // sequences often come together (prompts of similar lengths reach the interval on the same
  // step), and a region costs a wake-up of the other threads. No task, no region.
  struct Task {
    size_t target;
    int32_t layer;  // -1: every layer of the target, in turn
    std::vector<int32_t> due;
  };
  std::vector<Task> tasks;
  for (size_t t = 0; t < num_targets; ++t) {
    const CompressTarget& target = targets[t];
    const bool layers = target.policy->LayersConcurrent();
    const bool by_head = layers && target.policy->HeadsConcurrent();
    absl::StatusOr<std::vector<std::vector<int32_t>>> due_by_layer =
        DueByLayer(bm, *target.policy, target.id);
    if (!due_by_layer.ok()) {
      out[t] = due_by_layer.status();
      continue;
    }
    for (int32_t l = 0; l < bm.shape().num_layers; ++l) {
      std::vector<int32_t>& due = (*due_by_layer)[l];
      if (due.empty()) continue;
      if (!layers) {
        tasks.push_back({t, -1, {}});
        break;
      }
      if (by_head) {
        for (const int32_t h : due) tasks.push_back({t, l, {h}});
      } else {
        tasks.push_back({t, l, std::move(due)});
      }
    }
  }
  const auto n = static_cast<int64_t>(tasks.size());
  std::vector<absl::StatusOr<std::vector<KeepSet>>> sets(n);
  // A task per iteration, dynamic, so a thread the machine does not run leaves the rest to
  // the others. Every task runs; a target's first error in (layer, head) order is its result.
  if (n == 0) return out;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, n));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    const Task& task = tasks[i];
    const CompressTarget& target = targets[task.target];
    sets[i] = task.layer < 0 ? InTurn(bm, store, target)
                             : HostLayer(bm, store, *target.policy, target.id, task.layer, task.due,
                                         target.current_position);
  }
  for (int64_t i = 0; i < n; ++i) {
    absl::StatusOr<std::vector<KeepSet>>& result = out[tasks[i].target];
    if (!result.ok()) continue;  // an earlier error of the target (or its Due) stands
    if (!sets[i].ok()) {
      result = sets[i].status();
      continue;
    }
    result->insert(result->end(), std::make_move_iterator(sets[i]->begin()),
                   std::make_move_iterator(sets[i]->end()));
  }
  return out;
}

absl::StatusOr<std::vector<KeepSet>> HostKeepSets(const BlockManager& bm, const CpuKvStore& store,
                                                  PolicyState& policy, SequenceId id,
                                                  int32_t current_position, int num_threads) {
  const CompressTarget target{id, &policy, current_position};
  return std::move(HostKeepSets(bm, store, absl::MakeConstSpan(&target, 1), num_threads)[0]);
}

absl::StatusOr<std::vector<std::vector<KeepSet>>> ScoredKeepSets(
    const BlockManager& bm, const CpuKvStore& store, Scorer& scorer,
    absl::Span<const CompressTarget> targets) {
  struct Planned {
    size_t target;
    std::vector<int32_t> due;
    ScoringPlan plan;
    std::vector<std::vector<int32_t>> positions;   // [kv_head][slot]
    std::vector<std::vector<BlockId>> tables;      // [task]
    std::vector<absl::Span<const uint8_t>> masks;  // [task], into `results` (uniform plans)
    std::vector<absl::Span<const float>> scores;   // [task], into `results` (pooled plans)
  };
  const KvShape& shape = bm.shape();
  // Per target, per layer: the host's keep-sets, or the index of its plan in `planned`.
  std::vector<std::vector<std::pair<std::vector<KeepSet>, int64_t>>> layers(targets.size());
  std::vector<Planned> planned;
  for (size_t t = 0; t < targets.size(); ++t) {
    const CompressTarget& target = targets[t];
    BKV_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> due_by_layer,
                         DueByLayer(bm, *target.policy, target.id));
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      const std::vector<int32_t>& due = due_by_layer[l];
      if (due.empty()) continue;
      Planned p{t, due, {}, std::vector<std::vector<int32_t>>(shape.num_kv_heads), {}, {}, {}};
      std::vector<HeadKeys> heads(shape.num_kv_heads);
      for (int32_t h = 0; h < shape.num_kv_heads; ++h)
        heads[h] = GatherHead(bm, store, target.id, l, h, nullptr, &p.positions[h]);
      absl::StatusOr<ScoringPlan> plan =
          target.policy->PlanScoring(l, heads, due, target.current_position);
      if (absl::IsUnimplemented(plan.status())) {
        BKV_ASSIGN_OR_RETURN(
            std::vector<KeepSet> sets,
            HostLayer(bm, store, *target.policy, target.id, l, due, target.current_position));
        layers[t].emplace_back(std::move(sets), -1);
        continue;
      }
      BKV_RETURN_IF_ERROR(plan.status());
      p.plan = *std::move(plan);
      for (const ScoringTask& task : p.plan.tasks) {
        BKV_ASSIGN_OR_RETURN(const absl::Span<const BlockId> table,
                             bm.BlockTable(target.id, l, task.kv_head));
        p.tables.emplace_back(table.begin(), table.end());
      }
      layers[t].emplace_back(std::vector<KeepSet>{}, static_cast<int64_t>(planned.size()));
      planned.push_back(std::move(p));
    }
  }
  // One scorer call per distinct scoring shape (one, unless the targets run different
  // policies).
  std::deque<ScoringResult> results;
  std::vector<uint8_t> done(planned.size(), 0);
  for (size_t first = 0; first < planned.size(); ++first) {
    if (done[first]) continue;
    const ScoringShape sshape =
        ScoringShape::Of(planned[first].plan, shape.head_dim, shape.block_size);
    std::vector<ScoringJob> jobs;
    std::vector<size_t> owner;  // planned index of each job, tasks in order
    for (size_t i = first; i < planned.size(); ++i) {
      if (done[i] ||
          !(ScoringShape::Of(planned[i].plan, shape.head_dim, shape.block_size) == sshape)) {
        continue;
      }
      done[i] = 1;
      for (size_t k = 0; k < planned[i].plan.tasks.size(); ++k) {
        const ScoringTask& task = planned[i].plan.tasks[k];
        jobs.push_back({planned[i].tables[k], planned[i].positions[task.kv_head], &task});
        owner.push_back(i);
      }
    }
    results.emplace_back();
    BKV_RETURN_IF_ERROR(scorer.Score(sshape, jobs, &results.back()));
    for (size_t j = 0; j < jobs.size(); ++j) {
      // A uniform plan keeps the scorer's masks; a pooled one selects from its scores.
      Planned& p = planned[owner[j]];
      if (p.plan.pooled) {
        p.scores.push_back(results.back().ScoresOf(static_cast<int32_t>(j)));
      } else {
        p.masks.push_back(results.back().KeepOf(static_cast<int32_t>(j)));
      }
    }
  }
  std::vector<std::vector<KeepSet>> out(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    for (auto& [sets, index] : layers[t]) {
      if (index >= 0 && planned[index].plan.pooled) {
        // The layer's heads share a budget: the policy selects from the scores.
        const Planned& p = planned[index];
        std::vector<HeadKeys> heads(shape.num_kv_heads);
        for (int32_t h = 0; h < shape.num_kv_heads; ++h)
          heads[h] = {nullptr, p.positions[h].data(), static_cast<int32_t>(p.positions[h].size())};
        BKV_ASSIGN_OR_RETURN(sets, targets[t].policy->SelectFromScores(p.plan, heads, p.scores));
      } else if (index >= 0) {
        // One keep-set per due head, as Compress returns them: a head within budget has no
        // task and keeps every slot.
        const Planned& p = planned[index];
        BKV_ASSIGN_OR_RETURN(std::vector<KeepSet> scored, KeepSetsFromMasks(p.plan, p.masks));
        size_t next = 0;
        for (int32_t h : p.due) {
          if (next < scored.size() && scored[next].kv_head == h) {
            sets.push_back(std::move(scored[next++]));
            continue;
          }
          KeepSet all{p.plan.layer, h, std::vector<int32_t>(p.positions[h].size())};
          for (size_t i = 0; i < all.slots.size(); ++i) all.slots[i] = static_cast<int32_t>(i);
          sets.push_back(std::move(all));
        }
      }
      out[t].insert(out[t].end(), std::make_move_iterator(sets.begin()),
                    std::make_move_iterator(sets.end()));
    }
  }
  return out;
}

int64_t CountLayers(absl::Span<const KeepSet> sets) {
  int64_t n = 0;
  for (size_t i = 0; i < sets.size(); ++i) n += i == 0 || sets[i].layer != sets[i - 1].layer;
  return n;
}

}  // namespace beaconkv
