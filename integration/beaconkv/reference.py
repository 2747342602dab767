"""Plain NumPy forward pass and greedy decoder for Llama-architecture checkpoints.

Written for clarity, not speed: it is the yardstick the C++ engine's logits are checked against
and the instrument of the revisit analysis. Everything is computed in float32.

Model directory (HF layout): ``config.json``, ``model.safetensors``, ``tokenizer.json`` (see
beaconkv.tokenizer).

* ``greedy_generate(model_dir, prompt, max_new_tokens)`` -> generated text.
* ``Model.forward(ids)`` -> logits of a whole sequence (full causal attention).
* ``Model.generate(ids, max_new_tokens, record=True)`` also returns, per generated token and per
  (layer, query head), the attention weights over all earlier positions and the pre-RoPE query.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct

import numpy as np

from beaconkv.tokenizer import CharTokenizer

# ----------------------------------------------------------------------------- safetensors

_DTYPES = {"F32": (np.dtype("<f4"), 4), "F16": (np.dtype("<f2"), 2), "BF16": (None, 2)}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as float32 arrays (F32, F16 and BF16 supported).

    Layout: 8-byte little-endian header length n, n bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, then the data; offsets are
    relative to the end of the header. Errors name the file and the offending field."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: file has {len(raw)} bytes, too short for the header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file size {len(raw)}")
    try:
        header = json.loads(raw[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: header is not valid JSON ({e})") from None
    data_size = len(raw) - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
        shape = [int(s) for s in info.get("shape", [])]
        begin, end = info.get("data_offsets", [None, None])
        count = int(np.prod(shape)) if shape else 1
        np_dtype, width = _DTYPES[dtype]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise ValueError(f"{path}: tensor {name!r} has bad data_offsets {[begin, end]}")
        if end > data_size:
            raise ValueError(f"{path}: tensor {name!r} data_offsets end {end} is beyond the "
                             f"data section ({data_size} bytes); the file is truncated")
        if end - begin != count * width:
            raise ValueError(f"{path}: tensor {name!r} data_offsets span {end - begin} bytes, "
                             f"shape {shape} of {dtype} needs {count * width}")
        buf = raw[8 + n + begin:8 + n + end]
        if dtype == "BF16":
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=np_dtype).astype(np.float32)
        out[name] = arr.reshape(shape)
    return out


# ----------------------------------------------------------------------------- model


@dataclasses.dataclass
class Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def load(cls, path: str) -> "Config":
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if "head_dim" not in raw and "hidden_size" in raw and "num_attention_heads" in raw:
            raw["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
        raw.setdefault("num_key_value_heads", raw.get("num_attention_heads"))
        raw.setdefault("rope_theta", 10000.0)
        kwargs = {}
        for field in dataclasses.fields(cls):
            if field.name not in raw:
                if field.default is dataclasses.MISSING:
                    raise ValueError(f"{path}: missing field {field.name!r}")
                continue
            kwargs[field.name] = raw[field.name]
        cfg = cls(**kwargs)
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(f"{path}: num_attention_heads {cfg.num_attention_heads} is not a "
                             f"multiple of num_key_value_heads {cfg.num_key_value_heads}")
        return cfg


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """HF Llama rotate-half RoPE. x [..., T, head_dim], positions [T].

    The twin of core/rope.cc, operation for operation: inv_freq in float64 stored as float32
    (as HF), angles = float32 position x inv_freq in float32, cos/sin in float64 rounded to
    float32. The NumPy policy oracle (tests/python/numpy_policies.py) uses this one too."""
    hd = x.shape[-1]
    inv_freq = (1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)).astype(np.float32)
    angles = (positions[:, None].astype(np.float32) * inv_freq[None, :]).astype(np.float64)
    cos = np.cos(angles).astype(np.float32)  # [T, hd/2]
    sin = np.sin(angles).astype(np.float32)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@dataclasses.dataclass
class StepRecord:
    """What one query position saw: per layer and query head.

    attention: [layers, heads, position + 1] softmax weights over positions 0..position.
    query:     [layers, heads, head_dim] the query before RoPE."""

    position: int
    attention: np.ndarray
    query: np.ndarray


class Model:
    def __init__(self, model_dir: str):
        self.dir = model_dir
        self.config = Config.load(os.path.join(model_dir, "config.json"))
        self.tokenizer = CharTokenizer.load(os.path.join(model_dir, "tokenizer.json"))
        path = os.path.join(model_dir, "model.safetensors")
        self.w = read_safetensors(path)
        c = self.config
        d, hd = c.hidden_size, c.head_dim
        expect = {"model.embed_tokens.weight": (c.vocab_size, d), "model.norm.weight": (d,)}
        if not c.tie_word_embeddings:
            expect["lm_head.weight"] = (c.vocab_size, d)
        for i in range(c.num_hidden_layers):
            pre = f"model.layers.{i}."
            expect.update({
                pre + "self_attn.q_proj.weight": (c.num_attention_heads * hd, d),
                pre + "self_attn.k_proj.weight": (c.num_key_value_heads * hd, d),
                pre + "self_attn.v_proj.weight": (c.num_key_value_heads * hd, d),
                pre + "self_attn.o_proj.weight": (d, c.num_attention_heads * hd),
                pre + "mlp.gate_proj.weight": (c.intermediate_size, d),
                pre + "mlp.up_proj.weight": (c.intermediate_size, d),
                pre + "mlp.down_proj.weight": (d, c.intermediate_size),
                pre + "input_layernorm.weight": (d,),
                pre + "post_attention_layernorm.weight": (d,),
            })
        for name, shape in expect.items():
            if name not in self.w:
                raise ValueError(f"{path}: missing tensor {name!r}")
            if tuple(self.w[name].shape) != shape:
                raise ValueError(f"{path}: tensor {name!r} has shape {list(self.w[name].shape)}, "
                                 f"config.json implies {list(shape)}")
        if c.tie_word_embeddings:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]

    def _attention_block(self, i: int, x: np.ndarray, start: int, cache: list, record,
                         bias: np.ndarray | None = None):
        """Self-attention of layer i for new positions start..start+T-1 given x [T, d].

        cache[i] holds (keys after RoPE [KV, T_all, hd], values [KV, T_all, hd]). bias
        [KV, T, T] (start 0 only), if given, replaces the causal mask: it is added to the
        logits of every query head of the kv head."""
        c, w = self.config, self.w
        pre = f"model.layers.{i}.self_attn."
        t, hd, nh, nkv = x.shape[0], c.head_dim, c.num_attention_heads, c.num_key_value_heads
        pos = np.arange(start, start + t)
        q = (x @ w[pre + "q_proj.weight"].T).reshape(t, nh, hd).transpose(1, 0, 2)  # [H, T, hd]
        k = (x @ w[pre + "k_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        v = (x @ w[pre + "v_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        q_rot, k_rot = rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta)
        if cache[i] is None:
            cache[i] = (k_rot, v)
        else:
            cache[i] = (np.concatenate([cache[i][0], k_rot], 1),
                        np.concatenate([cache[i][1], v], 1))
        keys, values = cache[i]  # [KV, start+T, hd]
        group = nh // nkv
        keys = np.repeat(keys, group, axis=0)  # query head h reads kv head h // group
        values = np.repeat(values, group, axis=0)
        scores = q_rot @ keys.transpose(0, 2, 1) / np.sqrt(hd)  # [H, T, start+T]
        if bias is None:
            causal = pos[:, None] >= np.arange(start + t)[None, :]
            scores = np.where(causal[None], scores, -np.inf)
        else:
            scores = scores + np.repeat(bias, group, axis=0)
        probs = softmax(scores)
        if record is not None:
            record.append((probs, q))
        out = (probs @ values).transpose(1, 0, 2).reshape(t, nh * hd)
        return out @ w[pre + "o_proj.weight"].T

    def _run(self, ids: list[int], start: int, cache: list, record=None,
             bias: list | None = None) -> np.ndarray:
        c, w = self.config, self.w
        x = w["model.embed_tokens.weight"][np.asarray(ids)]  # [T, d]
        for i in range(c.num_hidden_layers):
            pre = f"model.layers.{i}."
            h = rms_norm(x, w[pre + "input_layernorm.weight"], c.rms_norm_eps)
            x = x + self._attention_block(i, h, start, cache, record,
                                          None if bias is None else bias[i])
            h = rms_norm(x, w[pre + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate = silu(h @ w[pre + "mlp.gate_proj.weight"].T)
            up = h @ w[pre + "mlp.up_proj.weight"].T
            x = x + (gate * up) @ w[pre + "mlp.down_proj.weight"].T
        x = rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
        return x @ w["lm_head.weight"].T  # [T, vocab]

    def forward(self, ids: list[int], attention_bias: list | None = None) -> np.ndarray:
        """Logits [len(ids), vocab] of a whole sequence with full causal attention, or with
        attention_bias: per layer None (causal) or an additive [kv_heads, T, T] term that
        replaces the causal mask (-inf where a query must not see a position, e.g. what a
        compressed cache had evicted by then; it must mask the future itself)."""
        n = self.config.num_hidden_layers
        if attention_bias is not None:
            t, kv = len(ids), self.config.num_key_value_heads
            if len(attention_bias) != n:
                raise ValueError(f"attention_bias: {len(attention_bias)} layers, the model has {n}")
            for i, b in enumerate(attention_bias):
                if b is not None and tuple(np.shape(b)) != (kv, t, t):
                    raise ValueError(f"attention_bias[{i}]: shape {list(np.shape(b))}, want "
                                     f"[{kv}, {t}, {t}]")
        return self._run(ids, 0, [None] * n, bias=attention_bias)

    def trace(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Teacher-forced pass over a whole sequence, recording every query.

        Returns logits [T, vocab], attention [layers, heads, T, T] (row t: weights of query t
        over positions 0..t) and pre-RoPE queries [layers, heads, T, head_dim]."""
        logits, attention, queries, _ = self.trace_with_keys(ids)
        return logits, attention, queries

    def trace_with_keys(self, ids: list[int]):
        """trace() plus the post-RoPE keys [layers, kv_heads, T, head_dim] the attention was
        computed from (as the KV cache stores them): (logits, attention, queries, keys)."""
        rec: list = []
        cache: list = [None] * self.config.num_hidden_layers
        logits = self._run(ids, 0, cache, rec)  # fills cache[layer] = (keys after RoPE, values)
        return (logits, np.stack([p for p, _ in rec]), np.stack([q for _, q in rec]),
                np.stack([k for k, _ in cache]))

    def generate(self, ids: list[int], max_new_tokens: int, record: bool = False):
        """Greedy decoding with a full KV cache; stops after eos (not included in the output).

        Returns (new token ids, records). With record=True, records[j] is the StepRecord of the
        query that predicted new token j+1 (the forward step that read new token j), for every
        generated token that was fed back; the prompt's last position predicts token 0 and is
        recorded as records' first entry when record=True."""
        cache = [None] * self.config.num_hidden_layers
        rec: list | None = [] if record else None
        logits = self._run(ids, 0, cache, rec)
        records: list[StepRecord] = []

        def keep(position: int) -> None:
            if rec is None:
                return
            att = np.stack([p[:, -1, :] for p, _ in rec])  # [L, H, position+1]
            qry = np.stack([q[:, -1, :] for _, q in rec])  # [L, H, hd]
            records.append(StepRecord(position, att, qry))
            rec.clear()

        keep(len(ids) - 1)
        out: list[int] = []
        for _ in range(max_new_tokens):
            nxt = int(np.argmax(logits[-1]))
            if nxt == self.tokenizer.eos_id:
                break
            out.append(nxt)
            if len(out) == max_new_tokens:
                break
            logits = self._run([nxt], len(ids) + len(out) - 1, cache, rec)
            keep(len(ids) + len(out) - 1)
        return out, records

    def encode_prompt(self, prompt: str) -> list[int]:
        return [self.tokenizer.bos_id] + self.tokenizer.encode(prompt)


def greedy_generate(model_dir: str, prompt: str, max_new_tokens: int) -> str:
    """Greedy full-cache continuation of `prompt` (text, without the end-of-sequence token)."""
    model = Model(model_dir)
    out, _ = model.generate(model.encode_prompt(prompt), max_new_tokens)
    return model.tokenizer.decode(out)


def main(argv: list[str] | None = None) -> int:
    """Greedy full-cache accuracy of a checkpoint on a split, with this reference."""
    import argparse
    import sys

    import beaconkv.task as task

    p = argparse.ArgumentParser(prog="python -m beaconkv.reference", description=main.__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--split", required=True)
    p.add_argument("--num", type=int, default=0, help="first NUM problems (0: all)")
    a = p.parse_args(argv)
    model = Model(a.model)
    recs = task.read_split(a.split)
    recs = recs[: a.num] if a.num else recs
    exact_answer = exact_trace = gen_tokens = 0
    for i, rec in enumerate(recs):
        out, _ = model.generate(model.encode_prompt(rec["prompt"]), len(rec["target"]) + 64)
        text = model.tokenizer.decode(out)
        exact_answer += task.extract_answer(text) == rec["answer"]
        exact_trace += text == rec["target"]
        gen_tokens += len(out) + 1  # with end-of-sequence
        print(f"{i + 1}/{len(recs)} answer_ok={exact_answer} trace_ok={exact_trace}",
              file=sys.stderr, flush=True)
    print(json.dumps({"model": a.model, "split": a.split, "problems": len(recs),
                      "exact_answer": exact_answer / len(recs),
                      "exact_trace": exact_trace / len(recs),
                      "mean_generated_tokens": gen_tokens / len(recs)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
