"""A wider copy of a Llama checkpoint that computes the same function, for cost measurements.

Every hidden vector of the copy is the original's repeated `factor` times ([x, x, ...]), and so
are the MLP's intermediate vector and the attention heads: `factor` times the query and kv
heads (each original head repeated, in the same GQA grouping), the same head_dim. Each Linear
becomes a factor x factor tiling of W / factor, so its output is the original's output repeated;
RMSNorm sees the same mean square. The copy therefore generates the same tokens (up to float
summation order) with factor^2 the Linears' work, factor times the attention's and factor
times the kv heads a cache policy scores: what the policy's share of decode would be on a
wider model running the same traces (`bench/engine_bench.py --model OUT`).

Usage: python3 tools/widen_model.py --model models/tiny-reasoner --factor 2 --out /tmp/wide2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "integration"))

from beaconkv.reference import read_safetensors  # noqa: E402


def widen_tensors(w: dict[str, np.ndarray], factor: int) -> dict[str, np.ndarray]:
    """The widened tensors: norms, embeddings and biases repeated, Linears tiled as W / factor
    (Qwen3's per-head q/k norms stay as they are)."""
    f = factor
    out = {}
    for name, a in w.items():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            out[name] = a  # per head_dim, shared by the heads: unchanged
        elif name.endswith("_proj.bias") and a.ndim == 1:
            out[name] = np.tile(a, f)  # the output is repeated, so is its bias
        elif name == "model.embed_tokens.weight":
            out[name] = np.tile(a, (1, f))  # each token's vector repeated
        elif name.endswith("norm.weight"):
            out[name] = np.tile(a, f)
        elif name == "lm_head.weight":
            out[name] = np.tile(a / f, (1, f))  # the vocabulary stays
        elif a.ndim == 2:
            out[name] = np.tile(a / f, (f, f))
        else:
            raise ValueError(f"widen_model: no rule for tensor {name!r} of shape {list(a.shape)}")
    return out


def widen_config(config: dict, factor: int) -> dict:
    c = dict(config)
    # The defaults the engine and the reference take, written out before they are scaled.
    if c.get("head_dim") is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        c[key] = c[key] * factor
    c["tie_word_embeddings"] = False  # the lm_head is written out (W / factor)
    c["torch_dtype"] = "float32"  # as written
    c["beaconkv_widened"] = {"factor": factor}
    return c


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    header, offset = {}, 0
    for name, a in tensors.items():
        n = a.size * 4
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def widen(model_dir: str, factor: int, out_dir: str) -> None:
    if factor < 1:
        raise ValueError(f"widen_model: --factor must be >= 1, got {factor}")
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    weights = os.path.join(model_dir, "model.safetensors")
    if not os.path.isfile(weights):
        raise ValueError(f"widen_model: {weights} not found (one unsharded safetensors file is "
                         "read)")
    w = read_safetensors(weights)
    if config.get("tie_word_embeddings"):
        # The widened lm_head (W / factor, tiled over its input) is not the widened embedding:
        # untie it.
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    tensors = widen_tensors(w, factor)
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(widen_config(config, factor), f, indent=1)
    for name in os.listdir(model_dir):  # tokenizer, generation config, splits
        src = os.path.join(model_dir, name)
        if name in ("config.json", "model.safetensors"):
            continue
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(out_dir, name), dirs_exist_ok=True)
        else:
            shutil.copy2(src, os.path.join(out_dir, name))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-reasoner"))
    ap.add_argument("--factor", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    widen(a.model, a.factor, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
