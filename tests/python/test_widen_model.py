"""tools/widen_model.py: a wider checkpoint that computes the same function."""

import importlib.util
import json
import os

import numpy as np
import pytest

import beaconkv.reference as ref
from beaconkv.task import read_split

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(MODEL, "config.json")),
                                reason="tiny-reasoner checkpoint not present")


def load_tool():
    spec = importlib.util.spec_from_file_location(
        "widen_model", os.path.join(ROOT, "tools", "widen_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def wide2(tmp_path_factory):
    out = tmp_path_factory.mktemp("wide2")
    load_tool().widen(MODEL, 2, str(out))
    return str(out)


def test_widened_model_has_twice_the_heads_and_width(wide2):
    with open(os.path.join(MODEL, "config.json")) as f:
        base = json.load(f)
    with open(os.path.join(wide2, "config.json")) as f:
        wide = json.load(f)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        assert wide[key] == 2 * base[key], key
    assert wide["head_dim"] == base["head_dim"]
    assert wide["num_hidden_layers"] == base["num_hidden_layers"]
    # The tokenizer and the splits come along, so the benches run on the copy as they are.
    assert os.path.isfile(os.path.join(wide2, "tokenizer.json"))
    assert os.path.isfile(os.path.join(wide2, "data", "dev.jsonl"))


def test_widened_model_computes_the_same_logits(wide2):
    base, wide = ref.Model(MODEL), ref.Model(wide2)
    problem = read_split(os.path.join(MODEL, "data", "dev.jsonl"))[0]
    ids = base.encode_prompt(problem["prompt"])[:40]
    a, b = base.forward(ids), wide.forward(ids)
    assert a.shape == b.shape
    assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max())
    # Not a copy of the original file: the Linears really are twice as wide.
    assert wide.w["model.layers.0.self_attn.q_proj.weight"].shape == (
        2 * base.w["model.layers.0.self_attn.q_proj.weight"].shape[0],
        2 * base.w["model.layers.0.self_attn.q_proj.weight"].shape[1])


def test_bad_factor_and_unknown_tensors_are_named(tmp_path):
    tool = load_tool()
    with pytest.raises(ValueError, match="--factor must be >= 1, got 0"):
        tool.widen(MODEL, 0, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="no rule for tensor 'odd' of shape \\[2, 2, 2\\]"):
        tool.widen_tensors({"odd": np.zeros((2, 2, 2), np.float32)}, 2)
