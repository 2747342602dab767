"""The reference engine against the NumPy reference, under batching, paging and preemption."""

import json
import os

import numpy as np
import pytest

import beaconkv
from beaconkv import reference
from beaconkv.task import read_split
from beaconkv.tokenizer import CharTokenizer

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")
POLICIES = ["full", "streaming", "h2o", "tova", "snapkv", "rkv", "rpc", "beacon"]


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.load(MODEL)


@pytest.fixture(scope="module")
def prompts(tok):
    problems = read_split(os.path.join(MODEL, "data", "dev.jsonl"))[:4]
    return [[tok.bos_id] + tok.encode(p["prompt"]) for p in problems], problems


def small_policy(name):
    """Policies squeezed so that they evict within a short generation."""
    knobs = {
        "full": {}, "streaming": {"budget": 24, "n_sinks": 4},
        "h2o": {"budget": 24}, "tova": {"budget": 24},
        "snapkv": {"budget": 24, "interval": 8}, "rkv": {"budget": 24, "interval": 8},
        "rpc": {"period": 16, "window": 8, "ratio": 4},
        "beacon": {"budget": 24, "interval": 8, "n_recent": 4, "n_beacons": 4,
                   "buffer_max": 16, "buffer_min": 8, "protect_prompt": False},
    }[name]
    return beaconkv.policy_config(name, **knobs)


def generate(prompt_list, max_new=40, with_outputs=False, **engine_kw):
    eng = beaconkv.Engine(MODEL, **engine_kw)
    for i, p in enumerate(prompt_list):
        eng.add_request(i, p, max_new_tokens=max_new, ignore_eos=True)
    outs = {o["id"]: o for o in eng.run()}
    assert eng.num_free_blocks == eng.num_usable_blocks, "blocks leaked"
    assert all(o["finish_reason"] == "length" for o in outs.values())
    result = [outs[i]["output"] for i in range(len(prompt_list))]
    return (result, eng, outs) if with_outputs else (result, eng)


def tight_pool(outs, stats, heads):
    """A pool well below what the batch used at its peak, yet big enough for any one
    sequence at its peak plus a block per head for the next append."""
    one = max(o["peak_blocks"] for o in outs.values()) + heads
    return 1 + max(one, int(0.6 * stats["peak_used_blocks"]))


def test_logits_match_numpy_reference_at_every_step(prompts):
    ids, problems = prompts
    model = reference.Model(MODEL)
    tok = CharTokenizer.load(MODEL)
    for p, prob in zip(ids[:3], problems[:3]):
        forced = tok.encode(prob["target"])[:48]
        eng = beaconkv.Engine(MODEL)
        eng.add_request(0, p, forced_output=forced, return_logits=True, max_new_tokens=64)
        got = eng.run()[0]["logits"]
        want = model.forward(p + forced)[len(p) - 1:len(p) - 1 + len(forced)]
        assert got.shape == want.shape
        scale = np.abs(want).max(axis=1, keepdims=True)
        assert np.all(np.abs(got - want) <= 1e-4 * scale), np.abs(got - want).max()


def test_greedy_output_matches_numpy_reference(prompts, tok):
    ids, problems = prompts
    outs, _ = generate(ids[:3], max_new=60)
    for out, prob in zip(outs, problems[:3]):
        want = reference.greedy_generate(MODEL, prob["prompt"], 60)
        # The reference stops at eos; the engine here ignores it.
        got = tok.decode(out)
        assert got[:len(want)] == want


@pytest.mark.parametrize("block_size", [1, 8, 16])
def test_greedy_is_batch_and_block_size_invariant(prompts, block_size):
    ids, _ = prompts
    alone = [generate([p], block_size=block_size)[0][0] for p in ids[:2]]
    mixed, _ = generate(ids, block_size=block_size, max_batch=4)
    assert mixed[:2] == alone
    reference_16, _ = generate(ids[:2], block_size=16)
    assert reference_16 == alone


@pytest.mark.parametrize("spec", ["beacon", "beacon-pooled"])
def test_beacon_compressions_on_two_threads_are_those_of_one(prompts, spec):
    """With two threads a step's compressions run in one region (HostKeepSets over the
    compressing sequences: a head per task, or a layer when the budget is pooled); every token
    is evicted at the same step as with one. Each prompt comes twice, so sequences of equal
    length compress on the same steps."""
    ids, _ = prompts
    policy = beaconkv.make_policy_config(spec, 64, knobs={"n_recent": 32})
    requests = ids + ids
    runs, compressions = [], []
    for threads in (1, 2):
        eng = beaconkv.Engine(MODEL, policy=policy, max_batch=len(requests), num_threads=threads)
        for i, p in enumerate(requests):
            eng.add_request(i, p, max_new_tokens=160, ignore_eos=True, record_evictions=True)
        outs = {o["id"]: o for o in eng.run()}
        runs.append([(outs[i]["output"], outs[i]["evicted_at"]) for i in range(len(requests))])
        compressions.append(json.loads(eng.stats_json())["compressions"])
    assert compressions[0] > 0 and compressions[1] == compressions[0]
    assert sum(int((ev != beaconkv.NEVER_EVICTED).sum()) for _, ev in runs[0]) > 0
    for (out1, ev1), (out2, ev2) in zip(*runs):
        assert out2 == out1
        np.testing.assert_array_equal(ev2, ev1)


@pytest.mark.parametrize("policy", POLICIES)
def test_swap_preemption_is_exact_for_every_policy(prompts, policy):
    ids, _ = prompts
    short = [p[:8] for p in ids]  # short prompts, long generation: growth forces preemption
    cfg = small_policy(policy)
    free, eng, outs = generate(short, max_new=64, with_outputs=True, policy=cfg, block_size=8)
    tight = tight_pool(outs, json.loads(eng.stats_json()), eng.num_kv_heads_total)
    squeezed, eng = generate(short, max_new=64, policy=cfg, block_size=8, num_blocks=tight,
                             preemption="swap", verify_integrity=True)
    stats = json.loads(eng.stats_json())
    assert stats["preemptions"]["swap"] > 0
    assert squeezed == free


def test_recompute_preemption_is_exact_for_full(prompts):
    ids, _ = prompts
    short = [p[:8] for p in ids]
    free, eng, outs = generate(short, max_new=64, with_outputs=True, block_size=8)
    tight = tight_pool(outs, json.loads(eng.stats_json()), eng.num_kv_heads_total)
    squeezed, eng = generate(short, max_new=64, block_size=8, num_blocks=tight,
                             preemption="recompute", verify_integrity=True)
    stats = json.loads(eng.stats_json())
    assert stats["preemptions"]["recompute"] > 0
    assert squeezed == free


def test_eviction_frees_blocks_and_reports_statistics(prompts):
    ids, _ = prompts
    _, eng = generate(ids, max_new=64, policy=small_policy("beacon"), block_size=8,
                      verify_integrity=True)
    stats = json.loads(eng.stats_json())
    assert stats["compressions"] > 0
    assert stats["tokens_evicted"] > 0
    assert stats["blocks_freed_by_eviction"] > 0
    for key in ("attention", "scoring", "selection", "compaction", "bookkeeping"):
        assert stats["time_seconds"][key] >= 0


def test_sampling_is_seeded_and_batch_invariant(prompts):
    ids, _ = prompts

    def sample(batch, seed):
        eng = beaconkv.Engine(MODEL)
        for i, p in enumerate(batch):
            # A hot temperature: the trained model is near-certain of most tokens at 1.0.
            eng.add_request(i, p, max_new_tokens=30, temperature=4.0, top_p=0.95, seed=seed,
                            ignore_eos=True)
        return {o["id"]: o["output"] for o in eng.run()}

    a = sample(ids[:1], 5)[0]
    assert sample(ids, 5)[0] == a
    assert sample(ids[:1], 6)[0] != a


def test_bad_requests_are_value_errors(prompts):
    ids, _ = prompts
    eng = beaconkv.Engine(MODEL)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.add_request(0, [])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request(1, [1, 10_000])
    with pytest.raises(ValueError, match="top_p"):
        eng.add_request(2, ids[0], top_p=0.0)
    eng.add_request(3, ids[0], max_new_tokens=2)
    with pytest.raises(ValueError, match="already queued"):
        eng.add_request(3, ids[0])
    small = beaconkv.Engine(MODEL, num_blocks=4)
    with pytest.raises(ValueError, match="needs .* blocks"):
        small.add_request(0, ids[0])


def test_a_policy_the_model_cannot_take_is_refused_at_construction():
    # Knobs that name the model's layers are checked against it when the engine is made,
    # not at the first request.
    for spec, message in (("beacon:blur_speed=0.02,blur_layers=4", "blur_layers names layer 4 "
                           "of a model of 4 layers"),
                          ("beacon:layer_budget_offsets=8/-8", "layer_budget_offsets has 2 "
                           "entries for a model of 4 layers")):
        with pytest.raises(ValueError, match=message):
            beaconkv.Engine(MODEL, policy=beaconkv.make_policy_config(spec, 96))
    eng = beaconkv.Engine(MODEL, policy=beaconkv.make_policy_config(
        "beacon:blur_speed=0.02,blur_layers=3", 96))
    assert eng.num_running == 0


def test_bad_model_directory_names_the_file(tmp_path):
    with pytest.raises((ValueError, RuntimeError, OSError), match="config.json"):
        beaconkv.Engine(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises((ValueError, RuntimeError), match="config.json"):
        beaconkv.Engine(str(tmp_path))


def test_gemm_path_agrees_with_the_batch_invariant_path(prompts, tok):
    ids, problems = prompts

    def forced_logits(batch_invariant):
        eng = beaconkv.Engine(MODEL, max_batch=4, batch_invariant=batch_invariant)
        for i, (p, prob) in enumerate(zip(ids, problems)):
            eng.add_request(i, p, forced_output=tok.encode(prob["target"])[:48],
                            return_logits=True, max_new_tokens=64)
        return {o["id"]: o["logits"] for o in eng.run()}

    exact, fast = forced_logits(True), forced_logits(False)
    for i in range(len(ids)):
        scale = np.abs(exact[i]).max(axis=1, keepdims=True)
        assert np.all(np.abs(fast[i] - exact[i]) <= 1e-4 * scale), i
    greedy_exact, _ = generate(ids, max_new=60, max_batch=4)
    greedy_fast, _ = generate(ids, max_new=60, max_batch=4, batch_invariant=False)
    assert greedy_fast == greedy_exact


@pytest.mark.parametrize("spec", ["beacon", "beacon-pooled"])
def test_paged_scorer_makes_the_host_decisions_on_the_shipped_model(prompts, spec):
    """scorer="paged" (the GPU pipeline's CPU twin over the block tables) against the policy's
    own scoring: the tiny model's greedy tokens and evictions are the same, under eviction
    at the shipped beacon defaults squeezed to a short generation, with uniform and pooled
    budgets (pooled: the scorer scores every head, the policy selects from the scores)."""
    ids, _ = prompts
    policy = beaconkv.make_policy_config(spec, 64, interval=16)
    host, host_eng, host_outs = generate(ids, max_new=300, with_outputs=True, policy=policy,
                                         max_batch=4)
    paged, paged_eng, paged_outs = generate(ids, max_new=300, with_outputs=True, policy=policy,
                                            max_batch=4, scorer="paged")
    assert paged == host
    host_stats = json.loads(host_eng.stats_json())
    paged_stats = json.loads(paged_eng.stats_json())
    assert host_stats["compressions"] > 0
    for key in ("compressions", "tokens_evicted", "blocks_freed_by_eviction"):
        assert paged_stats[key] == host_stats[key], key
    assert [o["tokens_evicted"] for o in paged_outs.values()] == \
        [o["tokens_evicted"] for o in host_outs.values()]


def test_unknown_scorer_is_a_clear_error():
    with pytest.raises(ValueError, match="scorer must be 'host' or 'paged'"):
        beaconkv.Engine(MODEL, scorer="gpu")
