"""Writes the seed corpora of the libFuzzer targets (committed under tests/fuzz/corpus/).

    python3 tests/fuzz/make_seeds.py

model_loader: valid tiny models (F32/F16/BF16, tied and untied) in the fuzzer's input layout
(u16 length + config.json, u16 length + tokenizer.json, then model.safetensors), plus a few
broken ones and two with a `beaconkv_policy`. block_manager and policy: seeded random operation
streams of several lengths.
Deterministic: the same files every run.
"""

from __future__ import annotations

import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def _tensor_bytes(values: list[float], dtype: str) -> bytes:
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    # BF16: the high half of the float32 bits.
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def tiny_model(dtype: str = "F32", tied: bool = True, layers: int = 1, seed: int = 0):
    rng = random.Random(seed)
    vocab, hidden, inter, heads, kv, hd = 5, 4, 6, 2, 1, 2
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
              "tie_word_embeddings": tied, "hidden_act": "silu"}
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden],
            p + "self_attn.q_proj.weight": [heads * hd, hidden],
            p + "self_attn.k_proj.weight": [kv * hd, hidden],
            p + "self_attn.v_proj.weight": [kv * hd, hidden],
            p + "self_attn.o_proj.weight": [hidden, heads * hd],
            p + "mlp.gate_proj.weight": [inter, hidden], p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter]})
    if not tied:
        shapes["lm_head.weight"] = [vocab, hidden]
    header, data = {}, b""
    for name, shape in sorted(shapes.items()):
        n = 1
        for d in shape:
            n *= d
        raw = _tensor_bytes([round(rng.uniform(-1, 1), 3) for _ in range(n)], dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    safetensors = struct.pack("<Q", len(text)) + text + data
    # The Hugging Face tokenizers layout the engine reads (a character-level WordLevel model).
    tokenizer = {"model": {"type": "WordLevel", "unk_token": "<pad>",
                           "vocab": {"<pad>": 0, "<bos>": 1, "<eos>": 2, "A": 3, "b": 4}}}
    return json.dumps(config).encode(), json.dumps(tokenizer).encode(), safetensors


def loader_input(config: bytes, tokenizer: bytes, safetensors: bytes) -> bytes:
    return (struct.pack("<H", len(config)) + config + struct.pack("<H", len(tokenizer)) + tokenizer
            + safetensors)


def main() -> None:
    out = os.path.join(HERE, "corpus", "model_loader")
    os.makedirs(out, exist_ok=True)
    seeds = {}
    for dtype in ("F32", "F16", "BF16"):
        for tied in (True, False):
            seeds[f"tiny_{dtype.lower()}_{'tied' if tied else 'untied'}"] = tiny_model(dtype, tied)
    seeds["tiny_two_layers"] = tiny_model("F32", False, layers=2, seed=1)
    c, t, s = tiny_model()
    seeds["truncated"] = (c, t, s[:-7])
    seeds["empty_safetensors"] = (c, t, b"")
    seeds["no_tokenizer"] = (c, b"", s)
    seeds["config_not_object"] = (b"[1,2]", t, s)
    # The setting a model ships (config.json's beaconkv_policy): one that builds, one that
    # does not.
    for name, spec in (("model_policy", "beacon-pooled:layer_budget_offsets=0/-16/16/0,"
                                        "blur_speed=0.02,blur_layers=3"),
                       ("model_policy_bad_knob", "beacon:n_becons=3")):
        seeds[name] = (json.dumps({**json.loads(c), "beaconkv_policy": spec}).encode(), t, s)
    for name, parts in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(loader_input(*parts))

    out = os.path.join(HERE, "corpus", "block_manager")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(13)
    for i, n in enumerate((16, 64, 256, 1024, 2048)):
        with open(os.path.join(out, f"ops_{i}_{n}"), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))

    # policy: random streams. The other files of that folder (named by their SHA-1) are what a
    # 15-minute run kept, minimised to its edges (`policy_fuzz -set_cover_merge=1
    # -use_counters=0 OUT CORPUS`, 2026-12-06): they let a 60-second run start past the config
    # and geometry checks, at every policy's compressions; this script does not rewrite them.
    out = os.path.join(HERE, "corpus", "policy")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(17)
    for i, n in enumerate((64, 512, 4096)):
        with open(os.path.join(out, f"ops_{i}_{n}"), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))


if __name__ == "__main__":
    main()
