"""Eviction policies from Python: names, config classes, errors, run_policy on NumPy arrays,
the stateful Policy, and keep-sets checked against the NumPy reference in
tests/python/numpy_policies.py."""

import functools
import pathlib
import sys

import numpy as np
import pytest

import beaconkv

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import numpy_policies as ref  # noqa: E402

NAMES = ["full", "streaming", "h2o", "tova", "snapkv", "rkv", "rpc", "beacon"]


def random_head(seed, n=200, d=16, g=4, steps=40):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n, d)).astype(np.float32)
    pre = rng.standard_normal((steps, g, d)).astype(np.float32) * 2
    post = rng.standard_normal((steps, g, d)).astype(np.float32) * 2
    return keys, pre, post


def test_policy_names():
    assert beaconkv.policy_names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_config_classes_round_trip(name):
    cfg = beaconkv.policy_config(name)
    assert cfg.name == name
    cfg.validate()
    assert type(cfg)(**cfg.to_dict()) == cfg
    assert name in repr(cfg) or type(cfg).__name__ in repr(cfg)
    traits = beaconkv.describe_policy(cfg)
    assert set(traits) == {"query_space", "gqa_reduction", "pooling", "trigger"}


def test_documented_defaults():
    b = beaconkv.BeaconConfig()
    assert (b.budget, b.interval, b.n_recent, b.n_beacons, b.buffer_max, b.buffer_min) == (
        2048, 32, 48, 256, 512, 256)
    # Every token outlives one compression among the protected newest (docs/policies.md).
    assert b.interval <= b.n_recent
    assert (b.pool_kernel, b.protect_prompt, b.budget_mode, b.coverage_layers) == (
        1, False, "uniform", 1)
    r = beaconkv.RKVConfig()
    assert (r.window, r.pool_kernel, r.lambda_, r.redundancy_threshold) == (8, 7, 0.1, 0.5)
    s = beaconkv.SnapKVConfig()
    assert (s.window, s.pool_kernel, s.pooling, s.interval) == (8, 7, "max", 128)
    p = beaconkv.RPCConfig()
    assert (p.period, p.window, p.ratio, p.pool_kernel, p.pooling) == (1024, 32, 4, 7, "avg")
    assert beaconkv.StreamingConfig().n_sinks == 4
    assert beaconkv.H2OConfig().recent_fraction == 0.5


def test_invalid_configurations_raise_value_error():
    with pytest.raises(ValueError, match="unknown policy \"lru\""):
        beaconkv.policy_config("lru")
    with pytest.raises(ValueError, match="smaller than the protected tokens"):
        beaconkv.BeaconConfig(budget=8).validate()
    with pytest.raises(ValueError, match="buffer_min"):
        beaconkv.BeaconConfig(buffer_min=600).validate()
    with pytest.raises(ValueError, match="coverage_layers"):
        beaconkv.BeaconConfig(coverage_layers=-1).validate()
    with pytest.raises(ValueError, match="no knob 'bogus'"):
        beaconkv.BeaconConfig(bogus=1)
    with pytest.raises(ValueError, match="pooled"):
        beaconkv.BeaconConfig(budget_mode="shared")
    keys, pre, post = random_head(0)
    with pytest.raises(ValueError, match="budget"):
        beaconkv.run_policy("snapkv", keys, np.arange(200), queries_post=post, budget=4)
    with pytest.raises(ValueError, match="positions"):
        beaconkv.run_policy("snapkv", keys, np.arange(10))
    with pytest.raises(ValueError, match="queries_pre"):
        beaconkv.run_policy("beacon", keys, np.arange(200), queries_pre=pre[:, :2],
                            queries_post=post)


@pytest.mark.parametrize("name", NAMES)
def test_run_policy_budget_protection_and_slot_order(name):
    keys, pre, post = random_head(1)
    n = keys.shape[0]
    knobs = {
        "full": {}, "streaming": {"budget": 64}, "h2o": {"budget": 64}, "tova": {"budget": 64},
        "snapkv": {"budget": 64}, "rkv": {"budget": 64}, "rpc": {"period": 64, "window": 8},
        "beacon": {"budget": 64, "buffer_max": 32, "buffer_min": 8, "n_beacons": 4},
    }[name]
    pos = np.arange(n, dtype=np.int32)
    kept = beaconkv.run_policy(name, keys, pos, prompt_len=5, queries_pre=pre,
                               queries_post=post, **knobs)
    assert kept.dtype == np.int32 and np.all(np.diff(kept) > 0)
    expected = {"full": n, "rpc": 5 + 8 + 16}.get(name, 64)
    assert kept.size == expected
    newest = {"streaming": 60, "h2o": 32, "snapkv": 8, "rkv": 8, "rpc": 8, "beacon": 16}
    assert set(range(n - newest.get(name, 0), n)) <= set(kept.tolist())
    # Same kept positions when the cache is stored in another slot order.
    perm = np.random.default_rng(5).permutation(n)
    kept2 = beaconkv.run_policy(name, keys[perm], pos[perm], prompt_len=5, queries_pre=pre,
                                queries_post=post, **knobs)
    assert sorted(pos[perm][kept2].tolist()) == kept.tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_snapkv_and_rkv_match_numpy(seed):
    keys, pre, post = random_head(10 + seed, n=301, d=32, g=3)
    window_q = post[-8:]
    pos = np.arange(keys.shape[0])
    got = beaconkv.run_policy("snapkv", keys, pos, queries_post=post, budget=100)
    np.testing.assert_array_equal(got, ref.snapkv_keep(keys, window_q, 100, window=8))
    got = beaconkv.run_policy("rkv", keys, pos, queries_post=post, budget=100)
    np.testing.assert_array_equal(got, ref.rkv_keep(keys, window_q, 100, window=8))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("coverage_layers", [0, 1])
@pytest.mark.parametrize("score_bf16", [False, True])
def test_beacon_matches_numpy(seed, coverage_layers, score_bf16):
    # score_bf16: the twin buffers the rounded queries and scores the rounded keys, recent
    # queries and rotated beacons.
    d, g, theta = 32, 2, 1e6
    keys, pre, post = random_head(20 + seed, n=257, d=d, g=g, steps=90)
    buf = ref.BeaconBuffer(d, buffer_min=16, buffer_max=48, bf16=score_bf16)
    for step in pre:
        buf.append(step)
    beacons = buf.beacons(8, 256, theta)
    r = ref.round_bf16 if score_bf16 else (lambda x: x)
    want = ref.beacon_keep(r(keys), r(post[-16:]), r(beacons), 96, prompt_len=7, n_recent=16,
                           protect_prompt=True, pool_kernel=3, coverage=coverage_layers > 0)
    got = beaconkv.run_policy(  # run_policy compresses layer 0
        beaconkv.BeaconConfig(budget=96, n_recent=16, n_beacons=8, buffer_min=16, buffer_max=48,
                              protect_prompt=True, pool_kernel=3,
                              coverage_layers=coverage_layers, score_bf16=score_bf16),
        keys, np.arange(257), prompt_len=7, queries_pre=pre, queries_post=post,
        rope_theta=theta)
    np.testing.assert_array_equal(got, want)


def test_round_bf16_twin_matches_the_core():
    # The twin's rounding is the core's (RoundToBf16), bit for bit, special values included.
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    bits[:4000] &= np.uint32(0x807FFFFF)  # denormals and zeros
    x = bits.view(np.float32)
    got = beaconkv.round_to_bf16(x)
    want = ref.round_bf16(x)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]


@pytest.mark.parametrize("radius,blur", [(0.0, 0.0), (0.75, 0.0), (0.0, 0.05)])
@pytest.mark.parametrize("prompt_slots", [0, 4])
@pytest.mark.parametrize("draw_on_fill", [False, True])
def test_beacon_compressions_match_numpy_over_a_sequence(draw_on_fill, prompt_slots, radius,
                                                         blur):
    # One head decoded for 150 steps, compressed whenever the core says it is due: every keep
    # set equals the NumPy twin's, whose buffer reduces at each draw (default) or only when
    # it would fill before the next draw (draw_on_fill); the two modes choose differently at
    # some compression. With prompt_slots=4, 3 are in effect ((40 - 8 - 2) // 8) over the 4
    # prompt tokens after the sinks. radius 0.75: draws of these random 16-dim queries stop
    # after about a dozen points, so fewer than n_beacons are beacons at some compressions.
    # blur 0.05 rad per token: the first 5 beacons also score with the RoPE pairs turning
    # faster zeroed (3 of the 8 at theta 1e4), which changes the keep set at some compression.
    d, g, theta, prompt = 16, 2, 1e4, 6
    cfg = dict(budget=40, interval=8, n_recent=8, n_sinks=2, n_beacons=12, buffer_min=16,
               buffer_max=64, coverage_layers=0, prompt_slots=prompt_slots,
               beacon_radius=radius, blur_speed=blur, blurred_beacons=5)
    blur_pairs = int(np.sum(theta ** (-2.0 * np.arange(d // 2) / d) > blur)) if blur else 0
    assert blur_pairs == (3 if blur else 0)
    rng = np.random.default_rng(7)
    pols = {mode: beaconkv.Policy(beaconkv.BeaconConfig(**cfg, draw_on_fill=mode), 1, 1, g, d,
                                  rope_theta=theta, prompt_len=prompt)
            for mode in (draw_on_fill, not draw_on_fill)}
    buf = ref.BeaconBuffer(d, 16, 64, draw_on_fill=draw_on_fill, radius=radius, bf16=True)
    keys = {m: rng.standard_normal((prompt, d)).astype(np.float32) for m in pols}
    pos = {m: np.arange(prompt, dtype=np.int32) for m in pols}
    keys[not draw_on_fill] = keys[draw_on_fill].copy()
    recent, kept_sets, compressions, short_draws, blur_moved = [], {m: [] for m in pols}, 0, 0, 0
    for p in range(prompt, prompt + 150):
        k = rng.standard_normal((1, d)).astype(np.float32)
        pre = rng.standard_normal((g, d)).astype(np.float32) * 2
        post = rng.standard_normal((g, d)).astype(np.float32) * 2
        buf.append(pre)
        recent = (recent + [post])[-8:]
        for m, pol in pols.items():
            keys[m] = np.vstack([keys[m], k])
            pos[m] = np.append(pos[m], np.int32(p))
            pol.observe(0, 0, p, pre, post)
            if not pol.due_heads(0, [keys[m].shape[0]]):
                continue
            [(_, _, slots)] = pol.compress(0, [keys[m]], [pos[m]], [0], p)
            if m == draw_on_fill:
                beacons = buf.beacons(12, p, theta)
                short_draws += int(len(beacons) < 12)
                # (The defaults buffer bfloat16 queries and score products of
                # bfloat16-rounded inputs: score_bf16.)
                bf = ref.round_bf16
                keep = functools.partial(ref.beacon_keep, bf(keys[m]), bf(np.stack(recent)),
                                         budget=40, prompt_len=prompt, n_recent=8, n_sinks=2,
                                         prompt_slots=prompt_slots, positions=pos[m])
                rows = np.concatenate([beacons, ref.blurred_rows(beacons, blur_pairs, 5)]) \
                    if blur else beacons
                want = keep(bf(rows))
                np.testing.assert_array_equal(np.sort(slots), np.sort(want), f"step {p}")
                blur_moved += int(blur > 0 and set(want) != set(keep(bf(beacons))))
                compressions += 1
            kept_sets[m].append(pos[m][slots].tolist())
            keys[m], pos[m] = keys[m][slots], pos[m][slots]
    assert compressions >= 10 and buf.reductions >= 2
    assert kept_sets[True] != kept_sets[False]
    assert (short_draws > 0) == (radius > 0)
    assert (blur_moved > 0) == (blur > 0)


def test_blur_layers_blur_only_the_listed_layers():
    # Three policies see the same two-layer decode: blurred rows nowhere, in every layer, and
    # in layer 1 only (blur_layers="1"). The last keeps what the first keeps in layer 0 and
    # what the second keeps in layer 1, where blurring changes some keep set.
    d, g, theta, layers = 16, 2, 1e4, 2
    base = dict(budget=32, interval=8, n_recent=4, n_sinks=2, n_beacons=8, buffer_min=16,
                buffer_max=48, coverage_layers=0, prompt_slots=0, blurred_beacons=8)
    cfgs = {"off": {}, "every": {"blur_speed": 0.05},
            "layer1": {"blur_speed": 0.05, "blur_layers": "1"}}
    pols = {n: beaconkv.Policy(beaconkv.BeaconConfig(**base, **c), layers, 1, g, d,
                               rope_theta=theta, prompt_len=4) for n, c in cfgs.items()}
    rng = np.random.default_rng(3)
    keys = [rng.standard_normal((4, d)).astype(np.float32) for _ in range(layers)]
    pos = [np.arange(4, dtype=np.int32) for _ in range(layers)]
    differs, compressions = [0, 0], 0
    for p in range(4, 160):
        for l in range(layers):
            keys[l] = np.vstack([keys[l], rng.standard_normal((1, d)).astype(np.float32)])
            pos[l] = np.append(pos[l], np.int32(p))
            pre = rng.standard_normal((g, d)).astype(np.float32) * 2
            post = rng.standard_normal((g, d)).astype(np.float32) * 2
            for pol in pols.values():
                pol.observe(l, 0, p, pre, post)
            if not pols["off"].due_heads(l, [keys[l].shape[0]]):
                continue
            kept = {n: sorted(pol.compress(l, [keys[l]], [pos[l]], [0], p)[0][2].tolist())
                    for n, pol in pols.items()}
            assert kept["layer1"] == kept["every" if l == 1 else "off"], f"layer {l} step {p}"
            differs[l] += kept["every"] != kept["off"]
            compressions += 1
            # Go on from the blurred-everywhere keep set in both layers (all three agree on
            # the tokens they hold; each policy only scores them).
            keys[l], pos[l] = keys[l][kept["every"]], pos[l][kept["every"]]
    assert compressions >= 20 and differs[0] > 0 and differs[1] > 0  # blurring matters in both
    bad = beaconkv.BeaconConfig(**base, blur_speed=0.05, blur_layers="2")
    with pytest.raises(ValueError, match="blur_layers names layer 2 of a model of 2 layers"):
        beaconkv.Policy(bad, layers, 1, g, d, rope_theta=theta, prompt_len=4)
    with pytest.raises(ValueError, match="blur_layers needs blur_speed > 0"):
        beaconkv.BeaconConfig(**base, blur_layers="1").validate()


def test_coverage_sample_is_one_token_per_stratum():
    protect = np.zeros(20, bool)
    protect[[0, 18, 19]] = True  # sink and recent window
    pos = np.arange(20)
    # free positions 1..17 (17 tokens), 4 strata of 17/4 positions: first of each.
    np.testing.assert_array_equal(ref.coverage_sample(pos, protect, 4), [1, 6, 10, 14])
    # Positions 0..40 in 4 strata of 41/4: [0, 10.25) [10.25, 20.5) [20.5, 30.75) [30.75, 41).
    # The gap leaves stratum 1 empty: 3 picks (indexes of positions 0, 30, 31).
    gap = np.array([0, 1, 2, 3, 30, 31, 32, 33, 40])
    np.testing.assert_array_equal(ref.coverage_sample(gap, np.zeros(9, bool), 4), [0, 4, 5])
    assert len(ref.coverage_sample(pos, protect, 50)) == 17


def test_apply_rope_matches_numpy_and_beacon_rotation():
    x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
    for t in (0, 1, 777, 2175):
        np.testing.assert_allclose(beaconkv.apply_rope(x, t, 1e6), ref.rope(x, t, 1e6),
                                   rtol=1e-5, atol=1e-5)


def test_stateful_policy_drives_compression():
    d, g, layers, heads = 8, 2, 2, 2
    pol = beaconkv.Policy(beaconkv.BeaconConfig(budget=24, interval=8, n_recent=4, n_sinks=2,
                                                n_beacons=4, buffer_max=16, buffer_min=8,
                                                protect_prompt=True),
                          num_layers=layers, num_kv_heads=heads, group_size=g, head_dim=d,
                          rope_theta=1e4, prompt_len=4)
    assert pol.name == "beacon" and not pol.needs_keys_on_observe
    rng = np.random.default_rng(0)
    keys = [[rng.standard_normal((4, d)).astype(np.float32) for _ in range(heads)]
            for _ in range(layers)]
    pos = [[np.arange(4, dtype=np.int32) for _ in range(heads)] for _ in range(layers)]
    compressions = 0
    for p in range(4, 80):
        for l in range(layers):
            for h in range(heads):
                keys[l][h] = np.vstack([keys[l][h], rng.standard_normal((1, d)).astype(np.float32)])
                pos[l][h] = np.append(pos[l][h], np.int32(p))
                q = rng.standard_normal((g, d)).astype(np.float32)
                pol.observe(l, h, p, q, q)
            due = pol.due_heads(l, [k.shape[0] for k in keys[l]])
            if due:
                for layer, h, slots in pol.compress(l, keys[l], pos[l], due, p):
                    assert layer == l and slots.size == 24
                    assert set(range(4)) <= set(pos[l][h][slots].tolist())  # prompt kept
                    keys[l][h], pos[l][h] = keys[l][h][slots], pos[l][h][slots]
                    compressions += 1
    assert compressions > 0
    assert all(k.shape[0] < 32 for row in keys for k in row)
    assert pol.state_bytes > 0
    with pytest.raises(ValueError, match="out of range"):
        pol.observe(5, 0, 0, np.zeros((g, d), np.float32), np.zeros((g, d), np.float32))
    h2o = beaconkv.Policy("h2o", 1, 1, 1, d)
    assert h2o.needs_keys_on_observe
    with pytest.raises(ValueError, match="needs the head's keys"):
        h2o.observe(0, 0, 0, np.zeros((1, d), np.float32), np.zeros((1, d), np.float32))


def test_docs_example_runs():
    # The example in docs/policies.md.
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((300, 64)).astype(np.float32)      # [n, head_dim] post-RoPE
    positions = np.arange(300, dtype=np.int32)
    q_pre = rng.standard_normal((100, 4, 64)).astype(np.float32)  # [steps, group, head_dim]
    q_post = rng.standard_normal((100, 4, 64)).astype(np.float32)
    cfg = beaconkv.BeaconConfig(budget=128)
    kept = beaconkv.run_policy(cfg, keys, positions, prompt_len=20,
                               queries_pre=q_pre, queries_post=q_post)
    assert kept.size == 128
    kept_snap = beaconkv.run_policy("snapkv", keys, positions, queries_post=q_post, budget=128)
    assert kept_snap.size == 128
