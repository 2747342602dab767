"""tools/widen_model.py: a wider checkpoint that computes the same function."""

import json
import os

import numpy as np
import pytest

import beaconkv
import beaconkv.reference as ref
from beaconkv.task import read_split

from conftest import load_tool  # tests/python/conftest.py

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(MODEL, "config.json")),
                                reason="tiny-reasoner checkpoint not present")


@pytest.fixture(scope="module")
def wide2(tmp_path_factory):
    out = tmp_path_factory.mktemp("wide2")
    load_tool("widen_model").widen(MODEL, 2, str(out))
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
    tool = load_tool("widen_model")
    with pytest.raises(ValueError, match="--factor must be >= 1, got 0"):
        tool.widen(MODEL, 0, str(tmp_path / "x"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="model.safetensors not found"):
        tool.widen(str(tmp_path), 2, str(tmp_path / "y"))
    with pytest.raises(ValueError, match="no rule for tensor 'odd' of shape \\[2, 2, 2\\]"):
        tool.widen_tensors({"odd": np.zeros((2, 2, 2), np.float32)}, 2)


def test_config_defaults_are_written_out_before_scaling():
    tool = load_tool("widen_model")
    c = tool.widen_config({"hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4,
                           "num_key_value_heads": None}, 2)
    # Absent or null: head_dim = hidden / heads and kv heads = heads, as the engine reads them.
    assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
            c["head_dim"]) == (256, 8, 8, 32)


def test_tied_embeddings_are_untied_and_compute_the_same_logits(tmp_path):
    tool = load_tool("widen_model")
    base = tmp_path / "base"
    tool.widen(MODEL, 1, str(base))
    w = ref.read_safetensors(str(base / "model.safetensors"))
    del w["lm_head.weight"]
    tool.write_safetensors(str(base / "model.safetensors"), w)
    with open(base / "config.json") as f:
        c = json.load(f)
    c["tie_word_embeddings"] = True
    with open(base / "config.json", "w") as f:
        json.dump(c, f)
    wide = tmp_path / "wide"
    tool.widen(str(base), 2, str(wide))
    with open(wide / "config.json") as f:
        assert json.load(f)["tie_word_embeddings"] is False
    problem = read_split(os.path.join(MODEL, "data", "dev.jsonl"))[0]
    a_model, b_model = ref.Model(str(base)), ref.Model(str(wide))
    ids = a_model.encode_prompt(problem["prompt"])[:40]
    a, b = a_model.forward(ids), b_model.forward(ids)
    assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max())


def test_biases_and_per_head_norms_widen_to_the_same_engine_logits(tmp_path):
    """Qwen2's q/k/v biases are repeated with their outputs; Qwen3's q/k norms (per head_dim)
    stay: the engine's logits of the widened copy are the original's."""
    tool = load_tool("widen_model")
    rng = np.random.default_rng(0)
    base = tmp_path / "base"
    tool.widen(MODEL, 1, str(base))  # a plain copy to add tensors to
    w = ref.read_safetensors(str(base / "model.safetensors"))
    with open(base / "config.json") as f:
        c = json.load(f)
    hd = c["head_dim"]
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}.self_attn."
        w[pre + "q_proj.bias"] = rng.normal(0, 0.1, c["num_attention_heads"] * hd).astype(np.float32)
        for kv in ("k", "v"):
            w[pre + f"{kv}_proj.bias"] = rng.normal(0, 0.1, c["num_key_value_heads"] * hd).astype(
                np.float32)
        for n in ("q_norm", "k_norm"):
            w[pre + f"{n}.weight"] = rng.uniform(0.5, 1.5, hd).astype(np.float32)
    tool.write_safetensors(str(base / "model.safetensors"), w)
    wide = tmp_path / "wide"
    tool.widen(str(base), 2, str(wide))
    ww = ref.read_safetensors(str(wide / "model.safetensors"))
    assert ww["model.layers.0.self_attn.q_norm.weight"].shape == (hd,)
    assert ww["model.layers.0.self_attn.k_proj.bias"].shape == (2 * c["num_key_value_heads"] * hd,)

    problem = read_split(os.path.join(MODEL, "data", "dev.jsonl"))[0]
    prompt = ref.Model(MODEL).encode_prompt(problem["prompt"])[:32]

    def logits(model_dir):
        eng = beaconkv.Engine(str(model_dir), policy=beaconkv.make_policy_config("full", None),
                              max_batch=1, num_threads=1)
        eng.add_request(0, prompt, max_new_tokens=8, return_logits=True)
        return np.asarray(eng.run()[0]["logits"], dtype=np.float64)

    a, b = logits(base), logits(wide)
    assert a.shape == b.shape and a.size > 0
    assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max())
    # The biases and norms took effect: the copy with them differs from the shipped model.
    assert np.abs(a - logits(MODEL)).max() > 1e-2

