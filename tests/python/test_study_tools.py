"""The accuracy-study tooling: policy replay (missed revisit mass), `beaconkv analyze`,
tools/run_study.py and tools/make_results.py. Runs on one problem cut to 60 output tokens."""

import argparse
import json
import os

import numpy as np
import pytest

from conftest import load_tool  # tests/python/conftest.py

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")
# Beacon's default recent window (48) does not fit the 24-token budgets used on short traces.
SHORT_TRACE_KNOBS = {"n_recent": 8}
CUT = 60  # output tokens kept per problem: enough for several compressions at budget 24

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(MODEL, "config.json")),
                                reason="tiny-reasoner checkpoint not present")


def short_config(spec, budget=None, interval=None):
    """The config of `spec` for a short trace: beacon gets SHORT_TRACE_KNOBS."""
    import beaconkv

    knobs = SHORT_TRACE_KNOBS if spec.startswith("beacon") else None
    return beaconkv.make_policy_config(spec, budget, interval=interval, knobs=knobs)


@pytest.fixture(scope="module")
def short_problem():
    from beaconkv import task
    from beaconkv.replay import truncate_record

    rec = task.read_split(os.path.join(MODEL, "data", "dev.jsonl"))[0]
    return truncate_record(rec, CUT)


@pytest.fixture(scope="module")
def trace(short_problem):
    from beaconkv.reference import Model
    from beaconkv.replay import record_trace

    return record_trace(Model(MODEL), short_problem)


@pytest.fixture
def short_split(tmp_path, short_problem):
    path = tmp_path / "short.jsonl"
    path.write_text(json.dumps(short_problem) + "\n")
    return str(path)


def test_truncate_record_cuts_roles_and_retrieval_to_match():
    from beaconkv.replay import truncate_record

    rec = {"target": "abcdef", "roles": "LPPRRZ", "retrieval": [3, 4], "prompt": "p"}
    cut = truncate_record(rec, 4)
    assert cut["target"] == "abcd" and cut["roles"] == "LPPR" and cut["retrieval"] == [3]
    assert truncate_record(rec, None) is rec and truncate_record(rec, 10) is rec


def test_recorded_keys_reproduce_the_recorded_attention(trace):
    from beaconkv.reference import rope, softmax

    n_layers, n_heads, t_len, hd = trace.queries.shape
    assert trace.keys.shape[0] == n_layers and trace.keys.shape[2:] == (t_len, hd)
    assert n_heads % trace.keys.shape[1] == 0
    assert len(trace.ids) == t_len and t_len - trace.prompt_len == CUT
    q = rope(trace.queries, np.arange(t_len), trace.rope_theta)
    k = np.repeat(trace.keys, n_heads // trace.keys.shape[1], axis=1)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    logits = np.where(np.tril(np.ones((t_len, t_len), bool)), logits, -np.inf)
    np.testing.assert_allclose(softmax(logits), trace.attention, atol=1e-5)


def test_streaming_replay_keeps_sinks_and_newest(trace):
    import beaconkv
    from beaconkv.replay import NEVER, eviction_steps

    assert NEVER == beaconkv.NEVER_EVICTED
    budget, sinks = 24, 4
    evicted_at, first = eviction_steps(trace, beaconkv.make_policy_config(
        "streaming", budget, knobs={"n_sinks": sinks}))
    t_len = len(trace.ids)
    assert evicted_at.shape == trace.keys.shape[:3] and evicted_at.dtype == np.int64
    # Every step down to `budget`, except the last: the engine does not compress after a
    # sequence's last step, so the newest budget - sinks + 1 positions are still there.
    expect = np.zeros(t_len, bool)
    expect[:sinks] = True
    expect[t_len - (budget - sinks) - 1:] = True
    for layer in range(evicted_at.shape[0]):
        for g in range(evicted_at.shape[1]):
            np.testing.assert_array_equal(evicted_at[layer, g] == NEVER, expect)
            # Streaming drops the oldest non-sink position at each step: position p leaves at
            # the step that caches p + budget - sinks.
            gone = np.nonzero(~expect)[0]
            np.testing.assert_array_equal(evicted_at[layer, g, gone],
                                          np.maximum(gone + budget - sinks, trace.prompt_len))
    # The prompt alone exceeds budget + interval: the first decode step compresses.
    assert first == trace.prompt_len
    assert (evicted_at[evicted_at != NEVER] >= first).all()
    assert (evicted_at[evicted_at != NEVER] < t_len - 1).all()


def forced_request(tok, problem):
    """(prompt ids, forced output) of `problem` as `beaconkv eval` feeds them: the target and
    end-of-sequence, so the engine caches every position of the trace."""
    return ([tok.bos_id] + tok.encode(problem["prompt"]),
            tok.encode(problem["target"]) + [tok.eos_id])


@pytest.mark.parametrize("spec,budget,interval", [
    ("streaming", 24, None), ("h2o", 24, None), ("tova", 24, None), ("snapkv", 24, 8),
    ("rkv", 24, 8), ("beacon", 24, 8), ("beacon-pooled", 24, 8)])
def test_replay_evictions_are_the_engines(trace, short_problem, spec, budget, interval):
    """The replay's evictions are those the engine makes serving the same tokens teacher forced,
    batched with another sequence: the same positions at the same steps in every head."""
    import beaconkv
    from beaconkv import task
    from beaconkv.replay import NEVER, eviction_steps, truncate_record
    from beaconkv.tokenizer import CharTokenizer

    cfg = short_config(spec, budget, interval)
    tok = CharTokenizer.load(MODEL)
    engine = beaconkv.Engine(MODEL, policy=cfg, block_size=8)
    prompt, forced = forced_request(tok, short_problem)
    other = truncate_record(task.read_split(os.path.join(MODEL, "data", "dev.jsonl"))[1], 40)
    o_prompt, o_forced = forced_request(tok, other)
    engine.add_request(7, o_prompt, forced_output=o_forced, max_new_tokens=len(o_forced))
    engine.add_request(3, prompt, forced_output=forced, max_new_tokens=len(forced),
                       record_evictions=True)
    out = {o["id"]: o for o in engine.run()}
    assert "evicted_at" not in out[7]
    evicted_at, first = eviction_steps(trace, cfg)
    assert prompt + forced[:-1] == trace.ids
    np.testing.assert_array_equal(out[3]["evicted_at"], evicted_at)
    assert out[3]["first_eviction_step"] == first
    assert out[3]["tokens_evicted"] == int((evicted_at != NEVER).sum()) > 0
    assert first >= trace.prompt_len
    assert (evicted_at[evicted_at != NEVER] < len(trace.ids) - 1).all()


def test_replay_rejects_bad_input(trace):
    import beaconkv
    from beaconkv.replay import eviction_steps

    engine = beaconkv.Engine(MODEL, max_batch=1)
    with pytest.raises(ValueError, match="token sequence is empty"):
        engine.replay_evictions([], 1, "full")
    with pytest.raises(ValueError, match="prompt_len 0 is outside"):
        engine.replay_evictions(trace.ids, 0, "full")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.replay_evictions([1, 5, 10_000], 2, "full")
    with pytest.raises(ValueError):
        engine.replay_evictions(trace.ids, trace.prompt_len,
                                beaconkv.BeaconConfig(budget=8, n_recent=64))
    engine.add_request(0, trace.ids[:trace.prompt_len], max_new_tokens=2)
    with pytest.raises(ValueError, match="1 requests are unfinished"):
        eviction_steps(trace, short_config("streaming", 24), engine)
    engine.run()
    # Still usable, and a full cache evicts nothing.
    evicted_at, first = eviction_steps(trace, short_config("full"), engine)
    assert (evicted_at == beaconkv.NEVER_EVICTED).all() and first == beaconkv.NEVER_EVICTED


def reference_eviction_steps(trace, policy_cfg):
    """The engine's drive order written out over a recorded trace (the replay's own loop before
    the engine recorded its evictions), open loop: every layer sees the full-cache queries and
    keys. Prefill: every prompt query is observed. Each decode step t: every (layer, kv_head)
    appends position t and observes query t, then each layer compresses the heads the policy
    reports due, at position t; not after the last step."""
    import beaconkv
    from beaconkv.reference import rope

    qry, keys = trace.queries, trace.keys
    n_layers, n_heads, t_len, hd = qry.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    p_len = trace.prompt_len
    q_post = rope(qry, np.arange(t_len), trace.rope_theta).astype(np.float32)
    q_pre = np.ascontiguousarray(qry, dtype=np.float32)
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    policy = beaconkv.Policy(policy_cfg, n_layers, n_kv, group, hd, trace.rope_theta, p_len)
    kept = [[np.arange(p_len, dtype=np.int32) for _ in range(n_kv)] for _ in range(n_layers)]
    evicted_at = np.full((n_layers, n_kv, t_len), np.iinfo(np.int64).max, dtype=np.int64)

    def observe(layer, g, t):
        hs = slice(g * group, (g + 1) * group)
        if policy.needs_keys_on_observe:
            pos = kept[layer][g]
            policy.observe(layer, g, t, q_pre[layer, hs, t], q_post[layer, hs, t],
                           keys[layer, g, pos], pos)
        else:
            policy.observe(layer, g, t, q_pre[layer, hs, t], q_post[layer, hs, t])

    for layer in range(n_layers):
        for t in range(p_len):
            for g in range(n_kv):
                observe(layer, g, t)
    for t in range(p_len, t_len):
        for layer in range(n_layers):
            for g in range(n_kv):
                kept[layer][g] = np.append(kept[layer][g], np.int32(t))
                observe(layer, g, t)
        if t == t_len - 1:
            break
        for layer in range(n_layers):
            due = policy.due_heads(layer, [len(k) for k in kept[layer]])
            if not due:
                continue
            pos = kept[layer]
            sets = policy.compress(layer, [keys[layer, g, pos[g]] for g in range(n_kv)], pos,
                                   list(due), t)
            for _, g, slots in sets:
                survivors = pos[g][np.asarray(slots, dtype=np.int64)]
                evicted_at[layer, g, np.setdiff1d(pos[g], survivors)] = t
                kept[layer][g] = survivors
    return evicted_at


@pytest.mark.parametrize("spec,budget,interval", [
    ("streaming", 24, None), ("h2o", 24, None), ("tova", 24, None), ("snapkv", 24, 8),
    ("rkv", 24, 8), ("beacon", 24, 8), ("beacon-pooled", 24, 8)])
def test_replay_follows_the_drive_order(trace, spec, budget, interval):
    """Regression guard on the engine's drive order (observe every head of every layer, then
    compress what is due, not after the last step): layer 0 sees the same queries and keys open
    and closed loop, so there the engine's evictions equal the written-out loop's exactly; in
    later layers the same number of positions leaves each head (each layer when the budget is
    pooled over heads) at each step."""
    from beaconkv.replay import NEVER, eviction_steps

    cfg = short_config(spec, budget, interval)
    got, _ = eviction_steps(trace, cfg)
    want = reference_eviction_steps(trace, cfg)
    np.testing.assert_array_equal(got[0], want[0])
    t_len = len(trace.ids)
    for ev in (got, want):
        assert (ev[ev != NEVER] < t_len - 1).all()
    steps = np.arange(t_len)
    per = (1,) if spec.endswith("-pooled") else ()  # sum over kv heads when pooled

    def count(ev):  # [L, (KV,) steps] positions evicted at each step
        return (ev[..., None] == steps).sum(-2).sum(per)

    np.testing.assert_array_equal(count(got), count(want))


def write_one_layer_model(dst):
    """The shipped checkpoint cut to its first layer: there the full-cache reference computes
    the very queries and keys the engine does, so its logits with attention masked to the
    engine's recorded evictions must be the engine's."""
    from beaconkv.reference import read_safetensors

    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = 1
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "tokenizer.json").write_bytes(open(os.path.join(MODEL, "tokenizer.json"), "rb").read())
    weights = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    header, blobs, offset = {}, [], 0
    for name, a in weights.items():
        if name.startswith("model.layers.") and not name.startswith("model.layers.0."):
            continue
        data = np.ascontiguousarray(a, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    (dst / "model.safetensors").write_bytes(
        len(head).to_bytes(8, "little") + head + b"".join(blobs))


@pytest.mark.parametrize("spec,interval", [("h2o", None), ("snapkv", 8), ("beacon", 8),
                                           ("beacon-pooled", 8)])
def test_one_layer_replay_reproduces_the_engine_logits(tmp_path, short_problem, spec,
                                                       interval):
    import beaconkv
    from beaconkv.reference import Model, rope, softmax
    from beaconkv.replay import eviction_steps, record_trace
    from beaconkv.tokenizer import CharTokenizer

    write_one_layer_model(tmp_path)
    model = Model(str(tmp_path))
    cfg = short_config(spec, 24, interval)
    tr = record_trace(model, short_problem)
    evicted_at, first = eviction_steps(tr, cfg)
    assert first < len(tr.ids) - 1
    # Reference logits with each head's attention restricted to what the replay kept.
    c, w = model.config, model.w
    t_len, hd, group = len(tr.ids), c.head_dim, c.num_attention_heads // c.num_key_value_heads
    pos = np.arange(t_len)
    # 0 where a head still sees a position, -inf elsewhere, plus the count bias where the
    # engine's attention adds it (beacon's coverage layer: log(N / K) per visible position).
    counted = beaconkv.count_bias_layers(cfg) > 0
    assert counted == spec.startswith("beacon")
    bias = np.repeat(load_tool("layer_eviction_probe").engine_bias(evicted_at[0], tr.ids, counted),
                     group, 0)  # [H, T, T]
    x = w["model.embed_tokens.weight"][tr.ids]
    h = model_norm(x, w["model.layers.0.input_layernorm.weight"], c.rms_norm_eps)
    v = (h @ w["model.layers.0.self_attn.v_proj.weight"].T).reshape(t_len, -1, hd)
    q = rope(tr.queries[0], pos, c.rope_theta)  # [H, T, hd]
    k = np.repeat(tr.keys[0], group, 0)
    probs = softmax(q @ k.transpose(0, 2, 1) / np.sqrt(hd) + bias)
    attn = (probs @ np.repeat(v.transpose(1, 0, 2), group, 0)).transpose(1, 0, 2)
    x = x + attn.reshape(t_len, -1) @ w["model.layers.0.self_attn.o_proj.weight"].T
    h = model_norm(x, w["model.layers.0.post_attention_layernorm.weight"], c.rms_norm_eps)
    gate = h @ w["model.layers.0.mlp.gate_proj.weight"].T
    x = x + (gate / (1 + np.exp(-gate)) * (h @ w["model.layers.0.mlp.up_proj.weight"].T)) @ \
        w["model.layers.0.mlp.down_proj.weight"].T
    logits = model_norm(x, w["model.norm.weight"], c.rms_norm_eps) @ w["lm_head.weight"].T
    # The engine, teacher forced, same policy.
    tok = CharTokenizer.load(str(tmp_path))
    engine = beaconkv.Engine(str(tmp_path), policy=cfg)
    forced = tok.encode(short_problem["target"]) + [tok.eos_id]
    engine.add_request(0, tr.ids[:tr.prompt_len], forced_output=forced, return_logits=True,
                       max_new_tokens=len(forced))
    got = np.asarray(engine.run()[0]["logits"]).reshape(len(forced), -1)
    np.testing.assert_allclose(got, logits[tr.prompt_len - 1:], atol=2e-4)


def model_norm(x, weight, eps):
    return weight * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def test_replay_masses_are_shares_and_full_misses_nothing(trace):
    from beaconkv.replay import replay_traces

    configs = {"full": short_config("full"), "streaming": short_config("streaming", 24),
               "beacon": short_config("beacon", 24, interval=8)}
    res = replay_traces([trace], configs)
    assert not res["full"].missed.any()
    full = res["full"].summary()
    assert full["missed_mass"] == 0.0 and full["sequences_compressed"] == 0
    assert full["queries"] == res["full"].missed.size  # no compression: every output query
    assert full["compression_ratio"] == 1.0
    # Streaming at budget 24, interval 1: every later query reads 24 kept tokens + its own.
    stream = res["streaming"]
    assert (stream.retained[:, :, stream.counted] == 25).all()
    assert stream.summary()["mean_retained_tokens"] == 25.0
    for name in ("streaming", "beacon"):
        r = res[name]
        assert r.missed.min() >= 0.0 and r.missed.max() <= 1.0 + 1e-6
        s = r.summary()
        assert s["sequences_compressed"] == 1
        assert 0.0 < s["missed_mass"] <= 1.0
        for key in ("missed_mass_global", "missed_mass_local"):
            assert s[key] is None or 0.0 <= s[key] <= 1.0
        assert 0 < s["queries"] <= r.missed.size
        assert s["global_queries"] <= s["queries"]


def test_replay_builds_its_grid_with_the_registry():
    import beaconkv
    from beaconkv.replay import policy_configs

    grid = policy_configs(["tova", "rpc", "beacon-pooled:n_recent=32"], 96, 16)
    assert grid["tova"] == beaconkv.TovaConfig(budget=96, interval=16)
    assert grid["rpc"].period == 4 * 96  # rpc takes the budget through its period
    assert grid["beacon-pooled:n_recent=32"] == beaconkv.BeaconConfig(
        budget=96, interval=16, n_recent=32, budget_mode="pooled")
    # A grid-wide knob a policy of the grid does not have is an error, not dropped.
    with pytest.raises(ValueError, match="policy tova has no knob 'n_beacons'"):
        policy_configs(["beacon", "tova"], 64, knobs=["n_beacons=4"])


def test_analyze_writes_summary_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from beaconkv.analyze_cli import add_analyze_parser

    parser = argparse.ArgumentParser()
    add_analyze_parser(parser.add_subparsers(), MODEL)
    out = tmp_path / "out"
    # --max-target-tokens keeps at least the plan (revisit.analyze needs its end).
    args = parser.parse_args(["analyze", "--model", MODEL, "--split", "dev", "--out", str(out),
                              "--num", "1", "--max-target-tokens", str(CUT),
                              "--no-greedy-check", "--replay",
                              "--policies", "full", "streaming", "--budget", "24"])
    assert args.func(args) == 0
    summary = json.loads((out / "summary.json").read_text(),
                         parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))
    assert 0.0 <= summary["global_query_fraction"] <= 1.0
    pols = summary["replay"]["policies"]
    assert set(pols) == {"full", "streaming"}
    assert pols["full"]["missed_mass"] == 0.0
    for key in ("missed_mass", "missed_mass_global", "missed_mass_local"):
        assert key in pols["streaming"]
    assert 0.0 < pols["streaming"]["missed_mass"] <= 1.0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "replay_missed_mass.png" in pngs and len(pngs) >= 4


def test_run_study_writes_one_json_per_run(tmp_path, short_split):
    study = load_tool("run_study")
    assert study.result_name("beacon", 128, "greedy") == "beacon_b128.json"
    assert study.result_name("beacon", 128, "tf") == "beacon_b128_tf.json"
    assert study.result_name("beacon-pooled", 128, "greedy") == "beacon-pooled_b128.json"
    assert (study.result_name("beacon:n_recent=32,pool_kernel=3", 64, "tf") ==
            "beacon__n_recent-32__pool_kernel-3_b64_tf.json")
    assert study.result_name("full", None, "tf") == "full_tf.json"
    assert (study.result_name("beacon:layer_budget_offsets=0/-16/16/0", 96, "greedy") ==
            "beacon__layer_budget_offsets-0_-16_16_0_b96.json")  # a list is no path
    assert study.plan(["full", "tova"], [32, 64], ["greedy"]) == [
        ("full", None, "greedy"), ("tova", 32, "greedy"), ("tova", 64, "greedy")]
    out = tmp_path / "results"
    rc = study.main(["--model", MODEL, "--split", short_split, "--num", "1", "--budgets", "24",
                     "--policies", "full", "streaming", "--out", str(out)])
    assert rc == 0
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == ["full.json", "full_tf.json", "streaming_b24.json", "streaming_b24_tf.json"]
    tf = json.loads((out / "streaming_b24_tf.json").read_text())
    assert tf["variant"] == "streaming" and tf["study_budget"] == 24
    assert tf["mode"] == "teacher_forced" and 0.0 <= tf["token_agreement"] <= 1.0
    greedy = json.loads((out / "streaming_b24.json").read_text())
    assert greedy["mode"] == "greedy" and greedy["compression_ratio"] > 1.0


def synthetic_result(policy, budget, accuracy, compression, tf=False, variant=None):
    r = {"policy": policy, "budget": budget, "num_problems": 10, "accuracy": accuracy,
         "mean_generated_tokens": 1000.0, "peak_kv_tokens_per_seq": 1100.0 / compression,
         "full_kv_tokens_per_seq": 1100.0, "compression_ratio": compression}
    if variant:
        r.update(variant=variant, study_budget=budget)
    if tf:
        r.update(teacher_forced=True, token_agreement=0.9, retrieval_accuracy=accuracy,
                 full_retrieval_accuracy=0.8, mean_kl=0.05)
    return r


def test_make_results_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    mk = load_tool("make_results")
    files = {
        "full.json": synthetic_result("full", None, 0.8, 1.0),
        "full_tf.json": synthetic_result("full", None, 0.8, 1.0, tf=True),
        "beacon_b64.json": synthetic_result("beacon", 64, 0.6, 6.0),
        "beacon_b64_tf.json": synthetic_result("beacon", 64, 0.4, 5.5, tf=True),
        "beacon-pooled_b64.json": synthetic_result("beacon", 64, 0.7, 6.0,
                                                   variant="beacon-pooled"),
        "snapkv_b32.json": synthetic_result("snapkv", 32, 0.2, 9.0),
        "notes.json": {"something": "else"},
    }
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    assert mk.main(["--results", str(tmp_path)]) == 0
    md = (tmp_path / "accuracy.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["full", "snapkv", "beacon",
                                                           "beacon-pooled"]
    beacon = rows[3]
    assert "| 64 |" in beacon and "0.600" in beacon and "75.0%" in beacon  # 0.6 / 0.8
    assert "6.00×" in beacon and "0.400" in beacon and "50.0%" in beacon  # TF: 0.4 / 0.8
    assert rows[2].count("–") == 6  # snapkv has no teacher-forced run
    lo, hi = mk.wilson(0.955, 200)  # 191 / 200: the 95 % Wilson interval
    assert abs(lo - 0.9167) < 1e-3 and abs(hi - 0.9762) < 1e-3
    assert mk.wilson(1.0, 200)[1] == 1.0 and mk.wilson(None, 200) is None
    png = (tmp_path / "accuracy_vs_compression.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # A re-run rewrites only the generated block; text around it stays.
    (tmp_path / "accuracy.md").write_text(md + "\n## What we tried\nnotes\n")
    assert mk.main(["--results", str(tmp_path)]) == 0
    again = (tmp_path / "accuracy.md").read_text()
    assert again.count(mk.BEGIN) == 1 and again.endswith("## What we tried\nnotes\n")


def test_make_results_pools_splits(tmp_path, capsys):
    mk = load_tool("make_results")
    a, b = tmp_path / "seed-a", tmp_path / "seed-b"
    a.mkdir(), b.mkdir()
    for d, acc in ((a, 0.9), (b, 0.8)):
        (d / "full.json").write_text(json.dumps(synthetic_result("full", None, 1.0, 1.0)))
        (d / "beacon_b96.json").write_text(json.dumps(synthetic_result("beacon", 96, acc, 8.0)))
    (a / "snapkv_b96.json").write_text(json.dumps(synthetic_result("snapkv", 96, 0.1, 8.0)))
    assert mk.main(["--pooled", str(a), str(b)]) == 0
    rows = {r.split("|")[1].strip(): r for r in capsys.readouterr().out.splitlines()[2:]}
    n = synthetic_result("beacon", 96, 0.9, 8.0)["num_problems"]
    lo, hi = mk.wilson(0.85, 2 * n)
    assert f"| 0.900 | 0.800 | 0.850 [{lo:.3f}, {hi:.3f}] | {2 * n} |" in rows["beacon"]
    assert f"| 0.100 | – | 0.100" in rows["snapkv"] and rows["snapkv"].endswith(f"| {n} |")
    assert list(rows) == ["full", "snapkv", "beacon"]
    assert mk.main(["--pooled", str(a), str(tmp_path / "none")]) == 1


def test_error_attribution_names_the_evicted_token_a_query_needed():
    from beaconkv.replay import NEVER, Trace

    attribution = load_tool("error_attribution")
    t_len, p_len = 6, 2
    att = np.zeros((1, 2, t_len, t_len))  # 1 layer, 2 query heads sharing 1 kv head
    att[0, 0, 5, [1, 3, 5]] = [0.7, 0.2, 0.1]  # head 0 reads position 1 (evicted) and 3
    att[0, 1, 5, [4, 5]] = [0.5, 0.5]  # head 1 reads only kept positions
    evicted_at = np.full((1, 1, t_len), NEVER, dtype=np.int64)
    evicted_at[0, 0, 1] = 4  # position 1 evicted after step 4, when it was 3 tokens old
    evicted_at[0, 0, 3] = 5  # evicted after step 5: still there when query 5 read it
    tr = Trace(ids=[10, 11, 12, 13, 14, 15], prompt_len=p_len, attention=att,
               queries=np.zeros((1, 2, t_len, 4)), keys=np.zeros((1, 1, t_len, 4)),
               rope_theta=1e4, roles=np.array(list("ABCDE")))
    (res,) = attribution.attribute(tr, evicted_at, [5], decode=lambda i: f"<{i}>",
                                   min_mass=0.1)
    assert res["query_position"] == 5
    assert [(h["layer"], h["head"]) for h in res["heads"]] == [(0, 0)]
    head = res["heads"][0]
    assert head["missed_mass"] == pytest.approx(0.7)
    assert head["tokens"] == [{"distance": 4, "token": "<11>", "role": "", "weight": 0.7,
                               "evicted_at_age": 3}]
    # Below min_mass nothing is listed.
    assert attribution.attribute(tr, evicted_at, [5], str, min_mass=0.8)[0]["heads"] == []


def test_error_attribution_counts_every_wrong_token(short_problem):
    attribution = load_tool("error_attribution")
    res = attribution.run(MODEL, "dev", "streaming", 8, 2, ["n_sinks=1"], None,
                          problems=[short_problem], max_errors=2)
    assert res["num_problems"] == 1
    wrong = sum(res["wrong_tokens_by_role"].values())
    assert wrong > 0  # an 8-token cache cannot carry the plan
    assert len(res["errors"]) == min(wrong, 2) and res["problems_with_errors"] == 1
    for e in res["errors"]:
        assert e["wanted"] != e["got"]
        for h in e["heads"]:
            assert 0.1 <= h["missed_mass"] <= 1.0 + 1e-6
            assert all(k["distance"] > 0 for k in h["tokens"])
    json.dumps(res)  # serialisable
    assert "problems with wrong tokens" in attribution.render(res)


def test_layer_eviction_probe_visibility_and_log_gap():
    probe = load_tool("layer_eviction_probe")
    big = probe.NEVER
    # Position 1 evicted after step 2: queries 0..2 see it, 3 and 4 do not.
    bias = probe.visibility_bias(np.array([[big, 2, big, big, big]]))
    visible = np.isfinite(bias[0])
    want = np.tril(np.ones((5, 5), dtype=bool))
    want[3:, 1] = False
    np.testing.assert_array_equal(visible, want)
    assert (bias[0][visible] == 0).all()
    # log_gap: a visible token stands for the positions up to the next visible one.
    gap = probe.visibility_bias(np.array([[big, 2, big, big, big]]), log_gap=True)[0]
    np.testing.assert_array_equal(np.isfinite(gap), want)
    np.testing.assert_allclose(gap[3, [0, 2, 3]], np.log([2, 1, 1]))
    np.testing.assert_allclose(gap[4, [0, 2, 3, 4]], np.log([2, 1, 1, 1]))
    np.testing.assert_allclose(gap[2, [0, 1, 2]], 0.0)


def test_layer_eviction_probe_oracle_regions():
    probe = load_tool("layer_eviction_probe")
    nl = 3
    # prompt 2 tokens, then the target "Ab\nC?\nAb\n" one token per character.
    ids = [1, 9, 5, 6, nl, 7, 8, nl, 5, 6, nl]
    regions = probe.oracle_regions(ids, 2, "Ab\nC?\nAb\n", nl)
    np.testing.assert_array_equal(np.nonzero(regions["prompt"])[0], [0, 1])
    np.testing.assert_array_equal(np.nonzero(regions["plan"])[0], [2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(np.nonzero(regions["newlines"])[0], [4, 7, 10])
    assert "plan" not in probe.oracle_regions(ids, 2, "Ab\nCd\nAb\n", nl)
    evicted = np.array([[0, 1, 2, 3], [3, 2, 1, 0]])
    kept = probe.keep_visible(evicted, np.array([False, True, False, True]))
    np.testing.assert_array_equal(kept, [[0, probe.NEVER, 2, probe.NEVER],
                                         [3, probe.NEVER, 1, probe.NEVER]])
    np.testing.assert_array_equal(evicted, [[0, 1, 2, 3], [3, 2, 1, 0]])  # input untouched


def test_layer_eviction_probe_runs_one_problem():
    probe = load_tool("layer_eviction_probe")
    # A budget the short trace never reaches: no eviction, so no variant changes a token.
    result = probe.run(MODEL, "dev", 1, "beacon", 4096, 32, dict(SHORT_TRACE_KNOBS), True, 2)
    names = [v["name"] for v in result["variants"]]
    assert names[:2] == ["all layers", "layer 0 alone"] and len(names) >= 4
    assert "layer 2 alone, prompt kept" in names and "layer 2 alone, newlines kept" in names
    with pytest.raises(ValueError, match="--oracle"):
        probe.run(MODEL, "dev", 1, "beacon", 4096, 32, dict(SHORT_TRACE_KNOBS), False, 9)
    assert all(v["problems_with_wrong_tokens"] == 0 for v in result["variants"])


def test_future_oracle_future_max_takes_later_queries_of_the_group():
    oracle = load_tool("future_oracle")
    # [group 2, T 3, T 3]; row t: query t's weights over positions 0..t.
    att = np.array([[[1.0, 0, 0], [0.2, 0.8, 0], [0.5, 0.1, 0.4]],
                    [[1.0, 0, 0], [0.6, 0.4, 0], [0.1, 0.3, 0.6]]])
    np.testing.assert_allclose(oracle.future_max(att), [[0.6, 0.8, 0.6],  # queries 1 and 2
                                                        [0.5, 0.3, 0.6],  # query 2 only
                                                        [0.0, 0.0, 0.0]])


def test_future_oracle_past_max_takes_queries_so_far():
    oracle = load_tool("future_oracle")
    att = np.array([[[1.0, 0, 0], [0.2, 0.8, 0], [0.5, 0.1, 0.4]],
                    [[1.0, 0, 0], [0.6, 0.4, 0], [0.1, 0.3, 0.6]]])
    np.testing.assert_allclose(oracle.past_max(att), [[1.0, 0.0, 0.0],
                                                      [1.0, 0.8, 0.0],
                                                      [1.0, 0.8, 0.6]])


def test_future_oracle_evictions_hand_worked():
    oracle = load_tool("future_oracle")
    t_len = 8
    future = np.zeros((t_len, t_len))
    future[:, 2] = 0.9  # position 2 is read later; 1 and 3 are not
    future[:, 3] = 0.1
    # Prompt 0..1; budget 3 + interval 2: the cache reaches 5 after step 4 and drops to 3,
    # keeping sink 0, the newest (4) and the best of 1..3 (2); then 5 after step 6 again.
    ev = oracle.oracle_evictions(future, 2, 3, 2, n_sinks=1, n_recent=1)
    never = oracle.NEVER
    # After step 6 the cache is {0, 2, 4, 5, 6}: 0 and 6 are protected, 2 outranks 4 and 5.
    np.testing.assert_array_equal(ev, [never, 4, never, 4, 6, 6, never, never])
    # Ties go to the newer position: with 2 and 3 equal, 3 stays at step 4.
    future[:, 3] = 0.9
    ev = oracle.oracle_evictions(future, 2, 3, 2, n_sinks=1, n_recent=1)
    assert ev[3] != 4 and ev[2] == 4


def test_future_oracle_follows_the_engines_schedule(short_problem):
    from beaconkv.reference import Model
    from beaconkv.replay import replay_engine

    oracle = load_tool("future_oracle")
    model = Model(MODEL)
    tok = model.tokenizer
    prompt = model.encode_prompt(short_problem["prompt"])
    ids = prompt + tok.encode(short_problem["target"])
    cfg = short_config("beacon", 24, 8)
    engine, _ = replay_engine(MODEL).replay_evictions(ids, len(prompt), cfg)
    engine = np.asarray(engine)
    rng = np.random.default_rng(0)
    future = rng.random((len(ids), len(ids)))
    ev = oracle.oracle_evictions(future, len(prompt), cfg.budget, cfg.interval, cfg.n_sinks,
                                 cfg.n_recent)
    steps = sorted(set(ev[ev < oracle.NEVER].tolist()))
    assert len(steps) >= 3  # several compressions on the short trace
    for layer in engine:
        for head in layer:
            # The same compression steps and the same number of tokens left after each.
            assert sorted(set(head[head < oracle.NEVER].tolist())) == steps
            for t in steps:
                assert (head > t).sum() == (ev > t).sum()
    # The sinks and the newest n_recent at each compression are never the oracle's choice.
    assert (ev[:cfg.n_sinks] == oracle.NEVER).all()


def test_future_oracle_runs_one_problem_and_checks_its_knobs():
    oracle = load_tool("future_oracle")
    # A budget the trace never reaches: neither row evicts, so no token changes.
    result = oracle.run(MODEL, "dev", 1, 4096, 32, dict(SHORT_TRACE_KNOBS), per_layer=True)
    names = [v["name"] for v in result["variants"]]
    assert names[:4] == ["full cache", "beacon", "future oracle", "hindsight"]
    assert "oracle in layer 2 only" in names
    assert result["n_recent"] == SHORT_TRACE_KNOBS["n_recent"]
    assert all(v["problems_with_wrong_tokens"] == 0 for v in result["variants"])
    with pytest.raises(ValueError, match="protect_prompt"):
        oracle.run(MODEL, "dev", 1, 4096, 32, {"protect_prompt": "1"})
