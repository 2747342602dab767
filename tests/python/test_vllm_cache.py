"""beaconkv.VllmKvCache (the pool behind beaconkv.vllm) without vLLM: room is all or nothing,
attention over the per-head slots equals a plain NumPy reference for prefill and decode rows,
and compression frees blocks while keeping the pool intact."""

from __future__ import annotations

import re

import numpy as np
import pytest

beaconkv = pytest.importorskip("beaconkv")
if not hasattr(beaconkv, "VllmKvCache"):
    pytest.skip("beaconkv extension without VllmKvCache", allow_module_level=True)

L, HKV, H, D = 2, 2, 4, 8


def reference(q, keys, values, qpos, kpos, scale):
    """q [n, H, D]; keys/values [t, HKV, D]; causal by position."""
    out = np.zeros_like(q)
    g = H // HKV
    for i in range(q.shape[0]):
        for h in range(H):
            mask = kpos <= qpos[i]
            s = keys[mask, h // g] @ q[i, h] * scale
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ values[mask, h // g]
    return out


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_attention_matches_reference_for_prefill_then_decode(block_size):
    rng = np.random.default_rng(block_size)
    cache = beaconkv.VllmKvCache(L, HKV, H, D, block_size, 400)
    lens = [5, 17, 1]  # prompt lengths of three sequences
    ids = [7, 3, 11]
    keys = {s: np.zeros((0, L, HKV, D), np.float32) for s in ids}
    vals = {s: np.zeros((0, L, HKV, D), np.float32) for s in ids}
    steps = [lens] + [[1, 1, 1]] * 4 + [[3, 1, 2]]  # prefill, decodes, a chunk step
    for step in steps:
        for s, n in zip(ids, step):
            assert cache.allocate(s, n, lens[ids.index(s)])
        total = sum(step)
        k_new = rng.standard_normal((total, L, HKV, D)).astype(np.float32)
        v_new = rng.standard_normal((total, L, HKV, D)).astype(np.float32)
        q = rng.standard_normal((total, L, H, D)).astype(np.float32)
        t0 = 0
        starts = {}
        for s, n in zip(ids, step):
            starts[s] = (t0, len(keys[s]))
            keys[s] = np.concatenate([keys[s], k_new[t0:t0 + n]])
            vals[s] = np.concatenate([vals[s], v_new[t0:t0 + n]])
            t0 += n
        for layer in range(L):
            out = np.zeros((total, H, D), np.float32)
            cache.attention(layer, np.array(ids, np.int32), np.array(step, np.int32),
                            np.ascontiguousarray(q[:, layer]),
                            np.ascontiguousarray(k_new[:, layer]),
                            np.ascontiguousarray(v_new[:, layer]), out, 0.3)
            for s, n in zip(ids, step):
                t0, p0 = starts[s]
                pos = np.arange(len(keys[s]))
                want = reference(q[t0:t0 + n, layer], keys[s][:, layer], vals[s][:, layer],
                                 pos[p0:p0 + n], pos, 0.3)
                np.testing.assert_allclose(out[t0:t0 + n], want, rtol=1e-5, atol=1e-5)
    cache.verify_integrity()
    for s in ids:
        cache.free(s)
    assert cache.num_used_blocks == 0


def test_allocation_is_all_or_nothing():
    cache = beaconkv.VllmKvCache(L, HKV, H, D, 4, 1 + 2 * L * HKV)  # block 0 is the null block
    assert cache.blocks_needed(1, 8) == 2 * L * HKV
    assert not cache.allocate(1, 9, 9)  # needs 3 blocks per head
    assert not cache.has(1) and cache.num_used_blocks == 0
    assert cache.allocate(1, 8, 8)
    assert cache.num_free_blocks == 0
    assert not cache.allocate(1, 1, 8)  # the next token needs a new block in every head
    assert cache.head_tokens(1).tolist() == [[8, 8], [8, 8]]
    cache.free(1)
    cache.free(1)  # unknown ids are ignored
    assert cache.num_free_blocks == 2 * L * HKV


def test_beacon_compression_frees_blocks_and_keeps_the_pool_intact():
    rng = np.random.default_rng(5)
    budget, interval = 8, 4
    cfg = beaconkv.policy_config("beacon", budget=budget, interval=interval, n_recent=2,
                                 n_sinks=1, n_beacons=2, buffer_min=4, buffer_max=8,
                                 protect_prompt=False, count_bias=False)
    cache = beaconkv.VllmKvCache(L, HKV, H, D, 4, 200, policy=cfg, rope_theta=1e4, observe=True)
    assert cache.allocate(1, 4, 4)
    seq = np.array([1], np.int32)
    for step in range(30):
        n = 4 if step == 0 else 1
        if step:
            assert cache.allocate(1, 1, 4)
        for layer in range(L):
            out = np.zeros((n, H, D), np.float32)
            cache.attention(layer, seq, np.array([n], np.int32),
                            rng.standard_normal((n, H, D)).astype(np.float32),
                            rng.standard_normal((n, HKV, D)).astype(np.float32),
                            rng.standard_normal((n, HKV, D)).astype(np.float32), out, 0.35)
        if step:
            used = cache.num_used_blocks
            res = cache.compress(1, 4 + step - 1)
            if res["compressions"]:
                assert res["tokens_evicted"] > 0
                assert cache.num_used_blocks == used - res["blocks_freed"]
        cache.verify_integrity()
        assert cache.head_tokens(1).max() < budget + interval
    assert cache.head_tokens(1).min() >= budget
    with pytest.raises(ValueError, match="no slots"):
        cache.attention(0, np.array([99], np.int32), np.array([1], np.int32),
                        np.zeros((1, H, D), np.float32), np.zeros((1, HKV, D), np.float32),
                        np.zeros((1, HKV, D), np.float32), np.zeros((1, H, D), np.float32), 1.0)


def _small_beacon(budget=8, interval=4, budget_mode="uniform", offsets=""):
    """A small beacon whose pool needs no token ids (the count bias, tested on its own below,
    changes the attention, not what these tests count)."""
    return beaconkv.policy_config("beacon", budget=budget, interval=interval, n_recent=2,
                                  n_sinks=1, n_beacons=2, buffer_min=4, buffer_max=8,
                                  budget_mode=budget_mode, count_bias=False,
                                  layer_budget_offsets=offsets)


def _forward(cache, rng, rows, total):
    """The rest of an engine step over rows [(seq, new tokens)] whose room is allocated: every
    layer's attention, then the policy on the decode rows (as the scheduler runs it; `total`:
    each sequence's tokens so far). Returns the blocks in use at the step's high point (after
    the append, before compression)."""
    seqs = np.array([s for s, _ in rows], np.int32)
    lens = np.array([n for _, n in rows], np.int32)
    t = int(lens.sum())
    for layer in range(L):
        cache.attention(layer, seqs, lens, rng.standard_normal((t, H, D)).astype(np.float32),
                        rng.standard_normal((t, HKV, D)).astype(np.float32),
                        rng.standard_normal((t, HKV, D)).astype(np.float32),
                        np.zeros((t, H, D), np.float32), 0.35)
    high = cache.num_used_blocks
    for seq, n in rows:
        if n == 1:
            cache.compress(seq, total[seq] - 1)
    return high


def test_per_layer_budgets_bound_each_layer():
    """layer_budget_offsets: each layer's heads cycle between their own budget and budget +
    interval (here layer 0 keeps 6, layer 1 keeps 10)."""
    rng = np.random.default_rng(6)
    budget, interval = 8, 4
    cache = beaconkv.VllmKvCache(L, HKV, H, D, 4, 200,
                                 policy=_small_beacon(budget, interval, offsets="-2/2"),
                                 rope_theta=1e4, observe=True)
    total = {1: 4}
    assert cache.allocate(1, 4, 4)
    _forward(cache, rng, [(1, 4)], total)
    for _ in range(40):
        assert cache.allocate(1, 1, 4)
        total[1] += 1
        _forward(cache, rng, [(1, 1)], total)
        held = cache.head_tokens(1).reshape(L, HKV)
        assert held[0].max() < 6 + interval and held[1].max() < 10 + interval
    assert held[0].min() >= 6 and held[1].min() >= 10
    cache.verify_integrity()
    with pytest.raises(ValueError, match="layer_budget_offsets has 3 entries for a model of 2"):
        beaconkv.VllmKvCache(L, HKV, H, D, 4, 200, policy=_small_beacon(offsets="-2/0/2"),
                             rope_theta=1e4, observe=True)  # refused before any sequence


def test_peak_blocks_bound_what_a_head_holds():
    budget, interval, bs = 8, 4, 4
    cache = beaconkv.VllmKvCache(L, HKV, H, D, bs, 200, policy=_small_beacon(budget, interval),
                                 rope_theta=1e4, observe=True)
    heads = L * HKV
    # max(prompt + 1, budget + interval) tokens per head, capped by the sequence's end.
    assert cache.peak_blocks(3, 1000) == heads * 3        # 12 tokens
    assert cache.peak_blocks(3, 7) == heads * 2           # ends at 7 tokens
    assert cache.peak_blocks(20, 1000) == heads * 6       # 21 tokens: the prompt's first step
    full = beaconkv.VllmKvCache(L, HKV, H, D, bs, 200)
    assert full.peak_blocks(3, 1000) is None
    assert full.block_demand() == []                      # nothing to follow without a trigger
    pooled = beaconkv.VllmKvCache(L, HKV, H, D, bs, 200,
                                  policy=_small_beacon(budget, interval, "pooled"), rope_theta=1e4)
    # Pooled: a layer's two heads hold 24 tokens together, split any way: (24 + 2 * 3) // 4.
    assert pooled.peak_blocks(3, 1000) == L * 7
    with pytest.raises(ValueError, match="unknown sequence 5"):
        cache.reserve(5, 10)
    # A prefill in chunks: the rest of its 6 tokens may come at the next step, so the demand
    # counts them from now on (the first append after them is token 7).
    assert cache.allocate(9, 2, 6)
    cache.reserve(9, 100, 6)
    assert cache.block_demand()[:2] == [heads * 2, heads * 2]  # 6 and 7 tokens, blocks of 4
    assert cache.block_demand()[2] == heads * 2 and cache.block_demand()[3] == heads * 3
    with pytest.raises(ValueError, match="negative length"):
        cache.admits(-1, 10, 1)


@pytest.mark.parametrize("budget_mode,offsets", [("uniform", ""), ("pooled", ""),
                                                 ("uniform", "-2/2")])
def test_block_demand_is_what_the_pool_then_holds(budget_mode, offsets):
    """The demand the pool predicts for each coming step (every head along its policy's cycle,
    each sequence up to its end) is exactly the blocks in use at that step's high point; with
    pooled budgets, where a compression splits a layer's tokens among its heads as the scores
    say, at least those blocks and at most one partial block per head more."""
    rng = np.random.default_rng(9)
    budget, interval, bs = 8, 4, 2
    cache = beaconkv.VllmKvCache(L, HKV, H, D, bs, 400,
                                 policy=_small_beacon(budget, interval, budget_mode, offsets),
                                 rope_theta=1e4, observe=True)
    ends = {1: 70, 2: 31, 3: 1000, 4: 40}  # max total tokens of each sequence
    starts = {1: (0, 3), 2: (2, 5), 3: (5, 15), 4: (9, 1)}  # step admitted, prompt tokens
    total = {}

    def run(step):
        rows = []
        for seq, (at, prompt) in starts.items():
            if step == at:
                assert cache.allocate(seq, prompt, prompt)
                cache.reserve(seq, ends[seq], prompt)
                rows.append((seq, prompt))
                total[seq] = prompt
            elif seq in total and total[seq] < ends[seq]:
                assert cache.allocate(seq, 1, starts[seq][1])
                rows.append((seq, 1))
                total[seq] += 1
            elif seq in total and cache.has(seq):
                cache.free(seq)  # ended
        return _forward(cache, rng, rows, total)

    for step in range(17):  # every sequence admitted; sequence 3's prompt is over its trigger
        run(step)
    demand = cache.block_demand()
    top = budget + max((int(x) for x in offsets.split("/") if x), default=0)  # largest layer's
    assert len(demand) == top + 2 * interval + 1
    assert demand[0] == cache.num_used_blocks
    highs = [run(step) for step in range(17, 17 + len(demand) - 1)]
    if budget_mode == "uniform":
        assert highs == demand[1:]
    else:
        slack = [d - h for d, h in zip(demand[1:], highs)]
        assert min(slack) >= 0 and max(slack) <= len(starts) * L * (HKV - 1), slack
        assert max(slack) > 0  # the compressions split some layer unevenly
    assert 0 < min(highs) < max(highs)  # sequence 2 ended inside the horizon; heads cycled
    cache.verify_integrity()


@pytest.mark.parametrize("budget_mode", ["uniform", "pooled"])
def test_admission_by_future_high_point_fits_more_and_never_runs_out(budget_mode):
    """Admitting a request when the pool's future high point fits (admits) holds more
    sequences at once than reserving every sequence's peak, and no step runs out of room."""
    rng = np.random.default_rng(3)
    budget, interval, bs = 8, 8, 4
    num_blocks = 60
    cache = beaconkv.VllmKvCache(L, HKV, H, D, bs, num_blocks,
                                 policy=_small_beacon(budget, interval, budget_mode),
                                 rope_theta=1e4, observe=True)
    prompt, length = 4, 60
    # 16 tokens per head: 4 blocks x 4 heads; pooled, a layer's 32 tokens split any way take
    # at most (32 + 2 * 3) // 4 = 9 blocks.
    peak = cache.peak_blocks(prompt, length)
    assert peak == (16 if budget_mode == "uniform" else 18)
    by_peaks = cache.num_usable_blocks // peak
    waiting, running, total, most, seq = 40, [], {}, 0, 0
    while waiting or running:
        # As vLLM schedules: the running sequences' next token first, then one waiting request
        # if the pool's future high point has room for it.
        rows = [(s, 1) for s in running]
        for s in running:
            total[s] += 1
            assert cache.allocate(s, 1, prompt), f"no room for sequence {s}"
        if waiting and cache.admits(prompt, length, prompt):
            seq, waiting = seq + 1, waiting - 1
            assert cache.allocate(seq, prompt, prompt)
            cache.reserve(seq, length, prompt)
            rows.append((seq, prompt))
            total[seq] = prompt
            running.append(seq)
        assert rows, "a request that fits an empty pool was refused"
        _forward(cache, rng, rows, total)
        most = max(most, len(running))
        for s in [s for s in running if total[s] >= length]:
            running.remove(s)
            cache.free(s)
    assert waiting == 0 and not running
    assert most > by_peaks
    cache.verify_integrity()


@pytest.mark.parametrize("scorer", ["host", "paged"])
def test_compress_many_decides_as_compress_one_by_one(scorer):
    """compress_many (on threads, or with scorer="paged" every planned head of the step in one
    call to the GPU pipeline's CPU twin) keeps what compress keeps one sequence at a time."""
    rng = np.random.default_rng(21)
    cfg = beaconkv.policy_config("beacon", budget=8, interval=4, n_recent=2, n_sinks=1,
                                 n_beacons=2, buffer_min=4, buffer_max=8, count_bias=False)
    caches = [beaconkv.VllmKvCache(L, HKV, H, D, 4, 400, policy=cfg, rope_theta=1e4,
                                   observe=True, scorer=s) for s in ("host", scorer)]
    ids, prompts = [4, 9, 2, 30], [3, 7, 1, 12]
    for c in caches:
        for s, p in zip(ids, prompts):
            assert c.allocate(s, p, p)
    evicted, compared = [0, 0], 0
    for step in range(25):
        lens = prompts if step == 0 else [1] * len(ids)
        if step:
            for c in caches:
                for s in ids:
                    assert c.allocate(s, 1, prompts[ids.index(s)])
        t = sum(lens)
        for layer in range(L):
            q = rng.standard_normal((t, H, D)).astype(np.float32)
            k = rng.standard_normal((t, HKV, D)).astype(np.float32)
            v = rng.standard_normal((t, HKV, D)).astype(np.float32)
            for c in caches:
                c.attention(layer, np.array(ids, np.int32), np.array(lens, np.int32), q, k, v,
                            np.zeros((t, H, D), np.float32), 0.35)
        if step:
            pos = [p + step - 1 for p in prompts]
            one_by_one = {}
            for s, p in zip(ids, pos):
                res = caches[0].compress(s, p)
                evicted[0] += res["tokens_evicted"]
                if res["keep"]:
                    one_by_one[s] = [(l, h, list(x)) for l, h, x in res["keep"]]
            res = caches[1].compress_many(np.array(ids, np.int32), np.array(pos, np.int32), 2,
                                          return_keep=step % 3 != 1)
            evicted[1] += res["tokens_evicted"]
            if step % 3 != 1:  # the keep-sets a replica pool would be sent: the same
                many = {s: [(l, h, list(x)) for l, h, x in sets] for s, sets in res["keep"]}
                assert many == one_by_one
                compared += len(many)
            else:
                assert "keep" not in res
        for s in ids:
            np.testing.assert_array_equal(caches[0].head_tokens(s), caches[1].head_tokens(s))
            for layer in range(L):
                for h in range(HKV):
                    a, b = caches[0].read_head(s, layer, h), caches[1].read_head(s, layer, h)
                    for x, y in zip(a, b):
                        np.testing.assert_array_equal(x, y)
        caches[1].verify_integrity()
    assert evicted[0] == evicted[1] > 0
    assert compared > 0
    with pytest.raises(ValueError, match="unknown sequence 77"):
        caches[1].compress_many(np.array([4, 77], np.int32), np.array([30, 30], np.int32), 2)
    with pytest.raises(ValueError, match="sequence 4 appears twice"):
        caches[1].compress_many(np.array([4, 4], np.int32), np.array([30, 30], np.int32), 2)
    with pytest.raises(ValueError, match="scorer must be 'host' or 'paged'"):
        beaconkv.VllmKvCache(L, HKV, H, D, 4, 400, policy=cfg, scorer="cuda")
    with pytest.raises(ValueError, match="differ in size"):
        caches[1].compress_many(np.array([4], np.int32), np.array([30, 30], np.int32), 1)


def test_a_second_thread_cannot_corrupt_or_crash_the_pool():
    """attention and compress_many run without the GIL; a second thread that frees and
    re-admits the same sequences meanwhile gets a clear error for a sequence that is gone,
    never a crash, and the pool stays intact (every call holds the cache's lock)."""
    import threading

    cache = beaconkv.VllmKvCache(L, HKV, H, D, 4, 4000,
                                 policy=beaconkv.make_policy_config("beacon", 64, interval=8),
                                 rope_theta=1e4, observe=True)
    ids = list(range(1, 9))
    prompt = 12
    lock = threading.Lock()  # guards the test's own `live` set, not the cache
    live = set()

    # The default beacon attends with the count bias, so allocations carry token ids and the
    # per-sequence counts are one more thing the lock guards.
    def admit(s):
        assert cache.allocate(s, prompt, prompt, token_ids=np.arange(prompt, dtype=np.int32) % 5)
        rng = np.random.default_rng(s)
        for layer in range(L):
            q = rng.standard_normal((prompt, H, D), dtype=np.float32)
            kv = rng.standard_normal((prompt, HKV, D), dtype=np.float32)
            cache.attention(layer, np.array([s], np.int32), np.array([prompt], np.int32), q, kv,
                            kv, np.empty_like(q), 0.3)

    for s in ids:
        admit(s)
        live.add(s)
    errors, unexpected = [], []
    stop, churn_done = threading.Event(), threading.Event()
    churned = [0]

    def decode():
        rng = np.random.default_rng(0)
        step = 0
        # Until the other thread has re-admitted 200 sequences too (or died), so the two overlap
        # whatever the scheduling.
        while step < 400 or (churned[0] < 200 and not churn_done.is_set()):
            with lock:
                rows = sorted(live)
            try:
                for s in rows:
                    cache.allocate(s, 1, prompt, token_ids=np.array([step % 5], np.int32))
                seq = np.array(rows, np.int32)
                ones = np.ones(len(rows), np.int32)
                q = rng.standard_normal((len(rows), H, D), dtype=np.float32)
                kv = rng.standard_normal((len(rows), HKV, D), dtype=np.float32)
                for layer in range(L):
                    cache.attention(layer, seq, ones, q, kv, kv, np.empty_like(q), 0.3,
                                    num_threads=2)
                cache.compress_many(seq, np.full(len(rows), prompt + step, np.int32), 2)
            except ValueError as e:  # a row freed by the other thread in between
                errors.append(str(e))
            except Exception as e:  # noqa: BLE001 - anything else is a failure
                unexpected.append(repr(e))
            step += 1
        stop.set()

    def churn():
        try:
            i = 0
            while not stop.is_set():
                s = ids[i % len(ids)]
                with lock:
                    live.discard(s)
                cache.free(s)
                admit(s)
                with lock:
                    live.add(s)
                i += 1
                churned[0] = i
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            unexpected.append("churn: " + repr(e))
        finally:
            churn_done.set()

    threads = [threading.Thread(target=decode), threading.Thread(target=churn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not unexpected, unexpected[:3]
    assert churned[0] >= 200
    for e in errors:
        assert re.search(r"unknown sequence|has no slots in the pool", e), e
    cache.verify_integrity()
    for s in ids:
        cache.free(s)
    assert cache.num_used_blocks == 0


def test_attention_refuses_rows_it_has_no_slots_for():
    cache = beaconkv.VllmKvCache(L, HKV, H, D, 4, 100)
    assert cache.allocate(1, 3, 3)
    q = np.zeros((5, H, D), np.float32)
    kv = np.zeros((5, HKV, D), np.float32)
    with pytest.raises(ValueError, match="5 new tokens, but only 3 slots"):
        cache.attention(0, np.array([1], np.int32), np.array([5], np.int32), q, kv, kv,
                        np.empty_like(q), 0.3)
    with pytest.raises(ValueError, match="negative query length"):
        cache.attention(0, np.array([1], np.int32), np.array([-1], np.int32), q, kv, kv,
                        np.empty_like(q), 0.3)
    with pytest.raises(ValueError, match="sequence 2 has no slots"):
        cache.attention(0, np.array([2], np.int32), np.array([1], np.int32), q, kv, kv,
                        np.empty_like(q), 0.3)
    cache.verify_integrity()
    cache.free(1)
    assert cache.num_used_blocks == 0


def test_count_bias_attention_matches_a_reference_that_adds_log_n_over_k():
    """count_bias inside the pool: each decode row of a coverage layer attends with log(N / K)
    added to every held slot's logit (N: the sequence's tokens of that id so far, K: the head's),
    worked out here from the head's slots; the other layers get no bias. Two sequences share
    the steps, the second admitted later, so their counts and heads are kept apart."""
    rng = np.random.default_rng(3)
    cfg = beaconkv.policy_config("beacon", budget=8, interval=4, n_recent=2, n_sinks=1,
                                 n_beacons=2, buffer_min=4, buffer_max=8, protect_prompt=False,
                                 count_bias=True, coverage_layers=1)
    cache = beaconkv.VllmKvCache(L, HKV, H, D, 4, 300, policy=cfg, rope_theta=1e4, observe=True)
    assert cache.needs_token_ids
    assert not beaconkv.VllmKvCache(L, HKV, H, D, 4, 10, policy=_small_beacon()).needs_token_ids
    assert not beaconkv.VllmKvCache(L, HKV, H, D, 4, 10).needs_token_ids  # full
    prompt = 5
    seqs = {4: 0, 9: 6}  # sequence -> the step it starts at
    tokens = {s: [] for s in seqs}      # id at each position
    kv = {s: [] for s in seqs}          # (k [L, HKV, D], v [L, HKV, D]) at each position
    biased_rows = 0
    for step in range(40):
        rows = [(s, prompt if step == t0 else 1) for s, t0 in seqs.items() if step >= t0]
        for s, n in rows:
            new = rng.integers(0, 3, n).astype(np.int32)  # few ids: many repeats
            assert cache.allocate(s, n, prompt, token_ids=new)
            tokens[s] += new.tolist()
        total = sum(n for _, n in rows)
        q = rng.standard_normal((total, L, H, D)).astype(np.float32)
        k = rng.standard_normal((total, L, HKV, D)).astype(np.float32)
        v = rng.standard_normal((total, L, HKV, D)).astype(np.float32)
        t0 = 0
        for s, n in rows:
            kv[s] += [(k[t0 + i], v[t0 + i]) for i in range(n)]
            t0 += n
        for layer in range(L):
            out = np.zeros((total, H, D), np.float32)
            cache.attention(layer, np.array([s for s, _ in rows], np.int32),
                            np.array([n for _, n in rows], np.int32),
                            np.ascontiguousarray(q[:, layer]), np.ascontiguousarray(k[:, layer]),
                            np.ascontiguousarray(v[:, layer]), out, 0.35)
            t0 = 0
            for s, n in rows:
                if n == 1:
                    p = len(tokens[s]) - 1
                    ids = np.array(tokens[s])
                    for h in range(H):
                        _, pos = cache.read_head(s, layer, h // (H // HKV))
                        keys = np.stack([kv[s][x][0][layer, h // (H // HKV)] for x in pos])
                        vals = np.stack([kv[s][x][1][layer, h // (H // HKV)] for x in pos])
                        logit = keys @ q[t0, layer, h] * 0.35
                        if layer == 0:
                            held = ids[pos]
                            n_seq = np.array([(ids[:p + 1] == t).sum() for t in held])
                            n_head = np.array([(held == t).sum() for t in held])
                            logit = logit + np.log(n_seq / n_head)
                            biased_rows += bool((n_seq > n_head).any())
                        w = np.exp(logit - logit.max())
                        np.testing.assert_allclose(out[t0, h], (w / w.sum()) @ vals,
                                                   rtol=2e-5, atol=2e-5)
                t0 += n
        for s, n in rows:
            if n == 1:
                cache.compress(s, len(tokens[s]) - 1)
        cache.verify_integrity()
    assert biased_rows > 50  # heads really were thinned unevenly across ids
    before = cache.head_tokens(4)
    with pytest.raises(ValueError, match="count bias needs the token ids"):
        cache.allocate(4, 1, prompt)
    with pytest.raises(ValueError, match="must hold the 2 new tokens' ids, got 1"):
        cache.allocate(4, 2, prompt, token_ids=np.zeros(1, np.int32))
    assert (cache.head_tokens(4) == before).all()  # the refusals allocated nothing
    for s in seqs:
        cache.free(s)
    assert cache.num_used_blocks == 0
