"""The NumPy reference: safetensors reader, RoPE, forward pass, and the shipped checkpoint."""

import json
import math
import pathlib
import random
import struct

import numpy as np
import pytest

import beaconkv.reference as ref
import beaconkv.task as task
from beaconkv.tokenizer import CharTokenizer

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "tiny-reasoner"


def write_safetensors(path, tensors, dtype="F32"):
    """Minimal independent writer: tensors {name: float32 array} stored as `dtype`."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "F32":
            data = a.astype("<f4").tobytes()
        elif dtype == "F16":
            data = a.astype("<f2").tobytes()
        else:  # BF16: keep the high half of each float32 (values chosen to be exact)
            data = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ----------------------------------------------------------------------------- safetensors

@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_safetensors_round_trip(tmp_path, dtype):
    vals = {"a": np.array([[1.0, -2.5, 0.125], [3.0, 0.0, -0.5]]), "b": np.array([7.0])}
    write_safetensors(tmp_path / "m.safetensors", vals, dtype)
    got = ref.read_safetensors(str(tmp_path / "m.safetensors"))
    assert set(got) == {"a", "b"}
    for k, v in vals.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape
        np.testing.assert_array_equal(got[k], v)


def test_truncated_safetensors_names_file_and_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"first": np.ones(4), "last.weight": np.ones(8)})
    raw = path.read_bytes()
    path.write_bytes(raw[:-4])
    with pytest.raises(ValueError, match=r"m\.safetensors.*'last\.weight'.*truncated"):
        ref.read_safetensors(str(path))
    path.write_bytes(raw[:6])
    with pytest.raises(ValueError, match=r"m\.safetensors.*too short"):
        ref.read_safetensors(str(path))
    path.write_bytes(struct.pack("<Q", 10 ** 6) + raw[8:])
    with pytest.raises(ValueError, match=r"m\.safetensors.*header length"):
        ref.read_safetensors(str(path))


def test_safetensors_rejects_inconsistent_shape(tmp_path):
    h = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    with pytest.raises(ValueError, match=r"bad\.safetensors.*'w'.*needs 12"):
        ref.read_safetensors(str(path))


# ----------------------------------------------------------------------------- math

def test_rope_matches_complex_rotation_of_half_pairs():
    rng = np.random.default_rng(0)
    hd, theta = 8, 500.0
    x = rng.standard_normal((5, hd)).astype(np.float32)
    pos = np.arange(3, 8)
    got = ref.rope(x, pos, theta)
    for t in range(5):
        for i in range(hd // 2):  # HF pairs dimension i with i + hd/2
            ang = pos[t] * theta ** (-2 * i / hd)
            z = complex(x[t, i], x[t, i + hd // 2]) * complex(math.cos(ang), math.sin(ang))
            assert got[t, i] == pytest.approx(z.real, abs=1e-5)
            assert got[t, i + hd // 2] == pytest.approx(z.imag, abs=1e-5)


def _random_model_dir(tmp_path, seed=0):
    rng = np.random.default_rng(seed)
    cfg = {"hidden_size": 12, "intermediate_size": 20, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
           "rope_theta": 100.0, "rms_norm_eps": 1e-5, "vocab_size": 11,
           "tie_word_embeddings": False}
    d, hd, f, v = 12, 6, 20, 11
    w = {"model.embed_tokens.weight": rng.standard_normal((v, d)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(d),
         "lm_head.weight": rng.standard_normal((v, d)) * 0.3}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "self_attn.q_proj.weight": rng.standard_normal((4 * hd, d)) * 0.4,
                  p + "self_attn.k_proj.weight": rng.standard_normal((2 * hd, d)) * 0.4,
                  p + "self_attn.v_proj.weight": rng.standard_normal((2 * hd, d)) * 0.4,
                  p + "self_attn.o_proj.weight": rng.standard_normal((d, 4 * hd)) * 0.3,
                  p + "mlp.gate_proj.weight": rng.standard_normal((f, d)) * 0.3,
                  p + "mlp.up_proj.weight": rng.standard_normal((f, d)) * 0.3,
                  p + "mlp.down_proj.weight": rng.standard_normal((d, f)) * 0.3,
                  p + "input_layernorm.weight": 1 + 0.1 * rng.standard_normal(d),
                  p + "post_attention_layernorm.weight": 1 + 0.1 * rng.standard_normal(d)})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_safetensors(tmp_path / "model.safetensors", w)
    CharTokenizer.from_chars("abcdefgh").save(str(tmp_path / "tokenizer.json"))
    return cfg, {k: np.asarray(a, dtype=np.float64) for k, a in w.items()}


def _loop_forward(cfg, w, ids):
    """Independent float64 forward: explicit loops over positions and heads, complex RoPE."""
    d, hd, nh, nkv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

    def norm(x, g):
        return g * x / math.sqrt(float(np.mean(x * x)) + eps)

    def rot(vec, pos):
        out = vec.copy()
        for i in range(hd // 2):
            z = complex(vec[i], vec[i + hd // 2]) * np.exp(1j * pos * theta ** (-2 * i / hd))
            out[i], out[i + hd // 2] = z.real, z.imag
        return out

    xs = [w["model.embed_tokens.weight"][t].copy() for t in ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        hs = [norm(x, w[p + "input_layernorm.weight"]) for x in xs]
        qs = [w[p + "self_attn.q_proj.weight"] @ h for h in hs]
        ks = [w[p + "self_attn.k_proj.weight"] @ h for h in hs]
        vs = [w[p + "self_attn.v_proj.weight"] @ h for h in hs]
        new = []
        for t, x in enumerate(xs):
            heads = []
            for h in range(nh):
                kv = h // (nh // nkv)
                q = rot(qs[t][h * hd:(h + 1) * hd], t)
                s = np.array([q @ rot(ks[j][kv * hd:(kv + 1) * hd], j) / math.sqrt(hd)
                              for j in range(t + 1)])
                a = np.exp(s - s.max())
                a /= a.sum()
                heads.append(sum(a[j] * vs[j][kv * hd:(kv + 1) * hd] for j in range(t + 1)))
            x = x + w[p + "self_attn.o_proj.weight"] @ np.concatenate(heads)
            m = norm(x, w[p + "post_attention_layernorm.weight"])
            g = w[p + "mlp.gate_proj.weight"] @ m
            u = w[p + "mlp.up_proj.weight"] @ m
            new.append(x + w[p + "mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * u))
        xs = new
    return np.stack([w["lm_head.weight"] @ norm(x, w["model.norm.weight"]) for x in xs])


def test_forward_matches_independent_loop_implementation(tmp_path):
    cfg, w = _random_model_dir(tmp_path)
    model = ref.Model(str(tmp_path))
    ids = [1, 4, 7, 3, 3, 9, 2]
    np.testing.assert_allclose(model.forward(ids), _loop_forward(cfg, w, ids), rtol=1e-4, atol=1e-4)


def test_attention_bias_replaces_the_causal_mask(tmp_path):
    cfg, _ = _random_model_dir(tmp_path, seed=5)
    model = ref.Model(str(tmp_path))
    ids = [1, 4, 7, 3, 3, 9, 2]
    t, kv, layers = len(ids), cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    causal = np.where(np.arange(t)[:, None] >= np.arange(t)[None, :], 0.0, -np.inf)
    full = model.forward(ids)
    # The causal mask given as a bias, or no bias for a layer: the same logits.
    np.testing.assert_array_equal(model.forward(ids, [np.tile(causal, (kv, 1, 1))] * layers), full)
    np.testing.assert_array_equal(model.forward(ids, [None] * layers), full)
    # Position 1 hidden from layer 0's queries 3.. (as an eviction after step 2 would):
    # positions 0..2 keep their logits, the later ones change.
    hidden = np.tile(causal, (kv, 1, 1))
    hidden[:, 3:, 1] = -np.inf
    got = model.forward(ids, [hidden] + [None] * (layers - 1))
    np.testing.assert_array_equal(got[:3], full[:3])
    assert np.abs(got[3:] - full[3:]).max(axis=-1).min() > 0
    with pytest.raises(ValueError, match=r"attention_bias\[0\]: shape \[1, 7, 7\], want"):
        model.forward(ids, [causal[None]] + [None] * (layers - 1))
    with pytest.raises(ValueError, match="attention_bias: 1 layers"):
        model.forward(ids, [None])


def test_cached_decoding_matches_full_forward_and_records(tmp_path):
    _random_model_dir(tmp_path, seed=3)
    model = ref.Model(str(tmp_path))
    prompt = [1, 5, 6]
    out, recs = model.generate(prompt, 6, record=True)
    seq = prompt + out
    full = model.forward(seq)
    assert out == [int(np.argmax(full[i])) for i in range(len(prompt) - 1, len(seq) - 1)]
    assert [r.position for r in recs] == list(range(len(prompt) - 1, len(seq)))[: len(recs)]
    for r in recs:
        assert r.attention.shape == (2, 4, r.position + 1)
        np.testing.assert_allclose(r.attention.sum(-1), 1.0, rtol=1e-5)
        assert r.query.shape == (2, 4, 6)


def test_model_rejects_shape_mismatch(tmp_path):
    _random_model_dir(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 21
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model\.safetensors.*mlp\.gate_proj\.weight.*shape"):
        ref.Model(str(tmp_path))


# ----------------------------------------------------------------------------- checkpoint

def test_shipped_checkpoint_layout():
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["num_attention_heads"] // cfg["num_key_value_heads"] >= 2
    total = sum(p.stat().st_size for p in MODEL.iterdir() if p.is_file())
    assert total <= 20 * 2 ** 20
    tok = CharTokenizer.load(str(MODEL))
    assert tok.vocab_size == cfg["vocab_size"]
    assert tok.decode(tok.encode(task.ALPHABET)) == task.ALPHABET


@pytest.mark.parametrize("seed,steps", [(11, 1), (12, 2), (13, 3)])
def test_greedy_generate_solves_short_problems(seed, steps):
    ex = task.generate(random.Random(seed), task.Difficulty(min_steps=steps, max_steps=steps))
    out = ref.greedy_generate(str(MODEL), ex.prompt, len(ex.target) + 8)
    assert task.extract_answer(out) == ex.answer, f"seed {seed}: got\n{out}"
    assert out == ex.target
