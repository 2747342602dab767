"""The beacon knob `prompt_slots` on the shipped model (docs/policies.md, "Prompt slots"):
every head outside the coverage layers keeps its best-scored prompt tokens through every
compression, uniform or pooled budgets, and the paged scorer (a reserved region in its plans)
makes the host's decisions."""
import os

import numpy as np
import pytest

import beaconkv
from beaconkv import reference
from beaconkv.evaluate import load_problems
from beaconkv.replay import replay_engine

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")


@pytest.fixture(scope="module")
def trace(dev_trace):
    _, prompt, ids = dev_trace
    return prompt, ids[:500]


def fewest_prompt_tokens(cfg, prompt, ids):
    """Per layer, the fewest unprotected prompt tokens (after the sinks) any kv head held after
    any decode step from the first eviction on."""
    evicted_at, first = replay_engine(MODEL).replay_evictions(ids, len(prompt), cfg)
    evicted_at = np.asarray(evicted_at)
    assert first < len(ids)  # the policy did compress
    region = evicted_at[:, :, cfg.n_sinks:len(prompt)]  # [layers, kv_heads, prompt tokens]
    steps = np.arange(first, len(ids))
    alive = (region[:, :, :, None] > steps).sum(axis=2)  # [layers, kv_heads, steps]
    return alive.min(axis=(1, 2))


def test_prompt_slots_hold_prompt_tokens_in_every_scored_head(trace):
    prompt, ids = trace
    plain = beaconkv.make_policy_config("beacon", 112, interval=8, knobs={"prompt_slots": 0})
    slots = beaconkv.make_policy_config("beacon", 112, interval=8, knobs={"prompt_slots": 6})
    # 112 - 48 recent - 4 sinks leaves 60 free slots: room for 7, so all six are in effect.
    assert beaconkv.prompt_slots_in_effect(slots) == 6
    assert beaconkv.prompt_slots_in_effect(plain) == 0
    without = fewest_prompt_tokens(plain, prompt, ids)
    with_slots = fewest_prompt_tokens(slots, prompt, ids)
    scored = slice(slots.coverage_layers, None)
    # Without the knob some scored head runs below six prompt tokens; with it none does.
    assert without[scored].min() < 6
    assert with_slots[scored].min() >= 6
    # The coverage layers keep their even sample either way.
    np.testing.assert_array_equal(with_slots[:slots.coverage_layers],
                                  without[:plain.coverage_layers])


def test_prompt_slots_are_on_by_default_and_shrink_with_the_free_slots():
    make = beaconkv.make_policy_config
    assert make("beacon", 96).prompt_slots == 4
    # At most one in eight of budget - n_recent - n_sinks: 96 leaves 44, 64 leaves 12.
    assert [beaconkv.prompt_slots_in_effect(make("beacon", b)) for b in (52, 59, 60, 64, 84, 96)] \
        == [0, 0, 1, 1, 4, 4]
    assert beaconkv.prompt_slots_in_effect(make("beacon", 96, knobs={"n_recent": 8})) == 4
    assert beaconkv.prompt_slots_in_effect(make("snapkv", 96)) == 0


def test_prompt_slots_with_pooled_budgets_hold_prompt_tokens(trace):
    prompt, ids = trace
    pooled = beaconkv.make_policy_config("beacon-pooled", 112, interval=8,
                                         knobs={"prompt_slots": 6})
    plain = beaconkv.make_policy_config("beacon-pooled", 112, interval=8,
                                        knobs={"prompt_slots": 0})
    scored = slice(pooled.coverage_layers, None)
    assert fewest_prompt_tokens(pooled, prompt, ids)[scored].min() >= 6
    assert fewest_prompt_tokens(plain, prompt, ids)[scored].min() < 6


def test_prompt_slots_are_scored_the_same_by_the_paged_scorer():
    # The paged scorer runs the plans (a reserved region in the layers the knob acts in); the
    # host scorer runs Compress, whose selection defines them.
    model = reference.Model(MODEL)
    prompts = [model.encode_prompt(r["prompt"]) for r in load_problems(MODEL, "dev", 2)]
    cfg = beaconkv.make_policy_config("beacon", 64, interval=16, knobs={"prompt_slots": 4})
    runs = {}
    for scorer in ("host", "paged"):
        eng = beaconkv.Engine(MODEL, max_batch=2, policy=cfg, scorer=scorer)
        for i, p in enumerate(prompts):
            eng.add_request(i, p, max_new_tokens=300, ignore_eos=True)
        runs[scorer] = {o["id"]: (o["output"], o["tokens_evicted"]) for o in eng.run()}
    assert all(evicted > 0 for _, evicted in runs["host"].values())
    assert runs["paged"] == runs["host"]


def test_prompt_slots_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match="prompt_slots"):
        beaconkv.make_policy_config("beacon", 64, knobs={"prompt_slots": -1})
    with pytest.raises(ValueError, match="prompt_slots"):
        beaconkv.make_policy_config("beacon", 64, knobs={"prompt_slots": "many"})
