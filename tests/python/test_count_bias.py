"""The count bias (beacon `count_bias`): the engine's attention in the coverage layers adds
log(N / K) to each held token's logit, N the tokens of its id the sequence has had so far, K
those the head still holds. Checked against the NumPy reference given that bias explicitly."""

import importlib.util
import json
import os

import numpy as np
import pytest

import beaconkv
from beaconkv import reference
from beaconkv.evaluate import load_problems

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")


def _probe():
    """tools/layer_eviction_probe.py (visibility_bias is tested in test_study_tools.py)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "layer_eviction_probe.py")
    spec = importlib.util.spec_from_file_location("layer_eviction_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


probe = _probe()
visible = probe.visibility_bias


def count_bias(evicted_at: np.ndarray, ids: list[int]) -> np.ndarray:
    """The probes' model of the engine's biased layer (layer_eviction_probe.engine_bias)."""
    return probe.engine_bias(evicted_at, ids, counted=True)


def forced_logits(cfg, prompt: list[int], forced: list[int]) -> np.ndarray:
    eng = beaconkv.Engine(MODEL, policy=cfg, max_batch=1)
    eng.add_request(0, prompt, forced_output=forced, return_logits=True,
                    max_new_tokens=len(forced))
    out = None
    while eng.has_unfinished:
        for o in eng.step():
            out = o
    return np.asarray(out["logits"]).reshape(len(forced), -1)


@pytest.fixture(scope="module")
def problem(dev_trace):
    model, prompt, ids = dev_trace
    return model, prompt, ids[:400]  # ~40 compressions at 64 / 8


def test_engine_matches_the_reference_with_the_count_bias(problem):
    model, prompt, ids = problem
    cfg = beaconkv.make_policy_config("beacon", 64, interval=8, knobs={"count_bias": True})
    got = forced_logits(cfg, prompt, ids[len(prompt):])
    engine = beaconkv.Engine(MODEL, max_batch=1)
    evicted_at = np.asarray(engine.replay_evictions(ids, len(prompt), cfg)[0])
    assert cfg.coverage_layers == 1  # the bias goes to layer 0 only
    masks = [visible(evicted_at[i]) for i in range(model.config.num_hidden_layers)]
    want = model.forward(ids, [count_bias(evicted_at[0], ids)] + masks[1:])
    unbiased = model.forward(ids, masks)
    span = slice(len(prompt) - 1, len(ids) - 1)
    np.testing.assert_allclose(got, want[span], atol=2e-3)
    # The bias is not a no-op here: without it the reference is far from the engine.
    assert np.abs(got - unbiased[span]).max() > 0.1


def test_without_evictions_the_count_bias_is_zero(problem):
    _, prompt, ids = problem
    forced = ids[len(prompt):]
    # A budget above the sequence's length: every id keeps all of its tokens, log(N / N) = 0.
    on = beaconkv.make_policy_config("beacon", 512)
    off = beaconkv.make_policy_config("beacon", 512, knobs={"count_bias": False})
    np.testing.assert_array_equal(forced_logits(on, prompt, forced),
                                  forced_logits(off, prompt, forced))


def test_count_bias_is_a_registry_knob():
    spec = {k.name: k for k in beaconkv.policy_spec("beacon").knobs}
    assert spec["count_bias"].default is True
    assert not beaconkv.make_policy_config("beacon", 64, knobs={"count_bias": False}).count_bias
    # Python asks the core which layers attend with the bias (the probes' model of them).
    assert beaconkv.count_bias_layers(beaconkv.make_policy_config("beacon", 64)) == 1
    assert beaconkv.count_bias_layers(beaconkv.make_policy_config(
        "beacon", 64, knobs={"coverage_layers": 2})) == 2
    assert beaconkv.count_bias_layers(beaconkv.make_policy_config(
        "beacon", 64, knobs={"count_bias": False})) == 0
    assert beaconkv.count_bias_layers(beaconkv.make_policy_config("snapkv", 64)) == 0
    with pytest.raises(ValueError, match="count_bias"):
        beaconkv.make_policy_config("beacon", 64, knobs={"count_bias": "sometimes"})


def _generate(prompts, cfg, **engine_kw):
    eng = beaconkv.Engine(MODEL, policy=cfg, block_size=8, **engine_kw)
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_new_tokens=64, ignore_eos=True)
    outs = {o["id"]: o for o in eng.run()}
    assert eng.num_free_blocks == eng.num_usable_blocks, "blocks leaked"
    return [outs[i]["output"] for i in range(len(prompts))], eng, outs


def test_count_bias_is_batch_invariant_and_exact_under_swap():
    model = reference.Model(MODEL)
    prompts = [model.encode_prompt(r["prompt"])[:8] for r in load_problems(MODEL, "dev", 4)]
    # Squeezed so that every head compresses within the generation.
    cfg = beaconkv.policy_config("beacon", budget=24, interval=8, n_recent=4, n_beacons=4,
                                 buffer_max=16, buffer_min=8, protect_prompt=False,
                                 count_bias=True)
    batched, eng, outs = _generate(prompts, cfg)
    alone = [_generate([p], cfg)[0][0] for p in prompts]
    assert batched == alone  # each row's bias goes to its own heads
    # A pool below the batch's peak: sequences are swapped out and back in mid-generation.
    stats = json.loads(eng.stats_json())
    tight = 1 + max(max(o["peak_blocks"] for o in outs.values()) + eng.num_kv_heads_total,
                    int(0.6 * stats["peak_used_blocks"]))
    swapped, eng, _ = _generate(prompts, cfg, num_blocks=tight, preemption="swap",
                                verify_integrity=True)
    assert json.loads(eng.stats_json())["preemptions"]["swap"] > 0
    assert swapped == batched
