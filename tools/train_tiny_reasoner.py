#!/usr/bin/env python3
"""Train the tiny reasoning model that ships in models/tiny-reasoner/ (not run in CI).

A small Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU) learns the plan-and-execute task
of beaconkv.task from freshly generated problems. Curriculum: 1-4 step problems until the
label-keyed copies of held-out short problems reach --gate (or --short-tokens-max tokens), then
a mix of short problems (with labels starting at random letters, so every label is trained) and
long ones up to --max-steps. The checkpoint is written in the HF layout (config.json,
model.safetensors in fp32 with HF tensor names, tokenizer.json) every --save-every-min minutes
whenever the teacher-forced exact-trace rate on held-out long problems is at least the best so
far. A trace is reproduced by greedy decoding exactly when every target token is the argmax
under teacher forcing, so that rate is the greedy full-cache trace accuracy.

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tools/train_tiny_reasoner.py \\
        --out models/tiny-reasoner --run-dir runs/tiny-reasoner --seed 1

Resume: add --resume (reads RUN_DIR/state.pt if present, else the weights in --out).
Evaluate: --eval-split FILE (teacher-forced, per role). The exact command that replays the
shipped checkpoint is in docs/testbed.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import beaconkv.task as task  # noqa: E402
from beaconkv.tokenizer import CharTokenizer  # noqa: E402


# ----------------------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(cfg: dict, length: int):
    hd = cfg["head_dim"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, KV, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = self.nh // self.nkv
        k = k.repeat_interleave(g, dim=1)  # query head h reads kv head h // g
        v = v.repeat_interleave(g, dim=1)
        att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd)) + mask
        y = torch.matmul(att.softmax(-1), v)  # [B, H, T, hd]
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class Layer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d, f, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, f, bias=False)
        self.mlp.up_proj = nn.Linear(d, f, bias=False)
        self.mlp.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class TinyLlama(nn.Module):
    """Parameter names match HF LlamaForCausalLM (model.layers.N.self_attn.q_proj.weight ...)."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.model.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.apply(self._init)
        scale = 1.0 / math.sqrt(2 * cfg["num_hidden_layers"])
        for layer in self.model.layers:
            layer.self_attn.o_proj.weight.data.mul_(scale)
            layer.mlp.down_proj.weight.data.mul_(scale)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):  # ids [B, T] -> logits [B, T, V]
        t = ids.shape[1]
        cos, sin = rope_tables(self.cfg, t)
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))


# ----------------------------------------------------------------------------- checkpoint io

def save_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_safetensors_f32(path: str) -> dict[str, torch.Tensor]:
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{path}: {name} has dtype {info['dtype']}"
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw, dtype="<f4", count=(b - a) // 4, offset=8 + n + a)
        out[name] = torch.from_numpy(arr.copy().reshape(info["shape"]))
    return out


def write_checkpoint(out_dir: str, model: TinyLlama, tok: CharTokenizer, extra: dict,
                     tasks: list[str]) -> None:
    """Write the HF-layout checkpoint; each file appears atomically (tmp + rename)."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(model.cfg)
    cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_act": "silu", "torch_dtype": "float32",
                "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
                "pad_token_id": tok.pad_id,
                "beaconkv_task_version": ",".join(task.TASKS[t] for t in tasks),
                "beaconkv_training": extra})
    tmp = os.path.join(out_dir, ".tmp")
    save_safetensors(tmp, model.state_dict())
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(tmp, "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, "config.json"))
    tok_dir = os.path.join(out_dir, ".tmp-tokenizer")
    tok.save_pretrained(tok_dir)  # HF tokenizer.json + tokenizer_config + generation_config
    for name in sorted(os.listdir(tok_dir)):
        os.replace(os.path.join(tok_dir, name), os.path.join(out_dir, name))
    os.rmdir(tok_dir)


# ----------------------------------------------------------------------------- data

ROLE_CODES = "LPROXCDAFVT"
CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "vocab_size",
               "max_position_embeddings", "tie_word_embeddings")


def encode_batch(tok: CharTokenizer, exs: list[task.Example]):
    """ids [B, T]; loss targets [B, T] (-100 on prompt); role codes [B, T] (-1 where none).

    Shorter problems are padded at the end (pad ids, no loss, no role): under the causal mask
    padding after a sequence changes none of its logits."""
    rows, tgts, roles = [], [], []
    for ex in exs:
        p = [tok.bos_id] + tok.encode(ex.prompt)
        t = tok.encode(ex.target) + [tok.eos_id]
        seq = p + t
        rows.append(seq[:-1])
        tgts.append([-100] * (len(p) - 1) + t)
        roles.append([-1] * (len(p) - 1) + [ROLE_CODES.index(r) for r in ex.roles] +
                     [ROLE_CODES.index("F")])
    width = max(len(r) for r in rows)
    for r, t, o in zip(rows, tgts, roles):
        pad = width - len(r)
        r += [tok.pad_id] * pad
        t += [-100] * pad
        o += [-1] * pad
    return torch.tensor(rows), torch.tensor(tgts), torch.tensor(roles)


def sample_steps(rng: random.Random, long_on: bool, args, name: str = "plan-exec") -> int:
    if not long_on:
        return rng.randint(1, 4)
    if rng.random() < args.short_frac:
        return rng.randint(1, 6)
    hi = args.defuse_steps[1] if name == "def-use" else args.max_steps
    return rng.randint(min(5, hi), hi)


def steps_range(text: str) -> tuple[int, int]:
    """--defuse-steps LO-HI (or N) as (lo, hi), checked once when the options are parsed."""
    lo, _, hi = text.partition("-")
    try:
        r = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI, got {text!r}") from None
    if not 1 <= r[0] <= r[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= LO <= HI, got {text!r}")
    return r


def make_batch(rng: random.Random, long_on: bool, args, tok):
    # One task per batch; the draw is skipped for plan-exec-only runs, so that their random
    # stream (and the replay of the shipped checkpoint) is unchanged.
    name = ("def-use" if args.defuse_frac > 0 and rng.random() < args.defuse_frac
            else "plan-exec")
    n = sample_steps(rng, long_on, args, name)
    diff = task.Difficulty(min_steps=n, max_steps=n, width=args.width)
    # Once long problems are on, short ones start at a random label so that every label is
    # trained cheaply (long problems alone reach the late letters rarely).
    first = rng.randint(0, task.MAX_STEPS - n) if args.label_offsets and long_on and n <= 6 else 0
    exs = [task.generate(rng, diff, first, name)]
    length = len(exs[0].prompt) + len(exs[0].target) + 2  # about the same for all of diff
    exs += [task.generate(rng, diff, first, name)
            for _ in range(max(1, args.batch_tokens // length) - 1)]
    return encode_batch(tok, exs)


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, batches) -> dict:
    """Teacher-forced per-role accuracy and exact-trace rate (== greedy full-cache accuracy)."""
    model.eval()
    hit = torch.zeros(len(ROLE_CODES))
    tot = torch.zeros(len(ROLE_CODES))
    exact, count, answer_ok = 0, 0, 0
    for ids, tgt, roles in batches:
        pred = model(ids).argmax(-1)
        ok = (pred == tgt) | (tgt == -100)
        exact += int(ok.all(1).sum())
        ans = roles == ROLE_CODES.index("A")
        answer_ok += int((ok | ~ans).all(1).sum())
        count += ids.shape[0]
        for r in range(len(ROLE_CODES)):
            m = roles == r
            hit[r] += (ok & m).sum()
            tot[r] += m.sum()
    model.train()
    res = {f"acc_{c}": round(float(hit[i] / tot[i]), 5) for i, c in enumerate(ROLE_CODES)
           if tot[i] > 0}
    res["exact"] = exact / count
    res["answer_tf"] = answer_ok / count
    return res


def eval_batches(tok, seed: int, count: int, lo: int, hi: int, args, per_batch: int,
                 name: str = "plan-exec"):
    out = []
    rng = random.Random(f"eval:{seed}:{lo}-{hi}" if name == "plan-exec"
                        else f"eval:{name}:{seed}:{lo}-{hi}")
    by_n: dict[int, list] = {}
    for _ in range(count):
        n = rng.randint(lo, hi)
        diff = task.Difficulty(min_steps=n, max_steps=n, width=args.width)
        by_n.setdefault(n, []).append(task.generate(rng, diff, task=name))
    for n in sorted(by_n):
        exs = by_n[n]
        for i in range(0, len(exs), per_batch):
            out.append(encode_batch(tok, exs[i:i + per_batch]))
    return out


def evaluate_split(model_dir: str, split: str) -> dict:
    """Greedy full-cache exact-trace accuracy (via teacher forcing) and per-role accuracy."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    model = TinyLlama({k: cfg[k] for k in CONFIG_KEYS})
    model.load_state_dict(load_safetensors_f32(os.path.join(model_dir, "model.safetensors")))
    tok = CharTokenizer.load(model_dir)
    by_n: dict[int, list] = {}
    for rec in task.read_split(split):
        ex = task.Example(rec["prompt"], rec["target"], rec["answer"], rec["roles"],
                          rec["n_steps"], rec.get("task_version", task.TASK_VERSION))
        by_n.setdefault(ex.n_steps, []).append(ex)
    batches = [encode_batch(tok, exs[i:i + 8]) for exs in by_n.values()
               for i in range(0, len(exs), 8)]
    res = evaluate(model, batches)
    res["problems"] = sum(len(v) for v in by_n.values())
    res["split"] = split
    return res


# ----------------------------------------------------------------------------- main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="models/tiny-reasoner", help="model directory to write")
    p.add_argument("--run-dir", default="runs/tiny-reasoner",
                   help="checkpoints and logs of the run")
    p.add_argument("--seed", type=int, default=1, help="initialisation and data seed")
    p.add_argument("--resume", action="store_true", help="continue from the run directory")
    p.add_argument("--layers", type=int, default=4, help="decoder layers")
    p.add_argument("--hidden", type=int, default=128, help="hidden size")
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA)")
    p.add_argument("--ffn", type=int, default=384, help="MLP intermediate size")
    p.add_argument("--rope-theta", type=float, default=100000.0, help="RoPE base")
    p.add_argument("--width", type=int, default=task.Difficulty().width,
                   help="task difficulty: values per register")
    p.add_argument("--max-steps", type=int, default=23, help="longest training problem")
    p.add_argument("--gate", type=float, default=0.95,
                   help="curriculum: train on 1-4 step problems until the plan copies (P) and "
                        "retrievals (R) of held-out short problems reach this accuracy ...")
    p.add_argument("--short-tokens-max", type=float, default=10e6,
                   help="... or this many tokens have been seen; then mix in long problems")
    p.add_argument("--short-frac", type=float, default=0.5,
                   help="once long problems are on: share of batches with 1-6 steps")
    p.add_argument("--defuse-frac", type=float, default=0.0,
                   help="share of batches from the def-use task (0: plan-exec only)")
    p.add_argument("--defuse-steps", type=steps_range, metavar="LO-HI",
                   default=(task.Difficulty().min_steps, task.Difficulty().max_steps),
                   help="chain lengths of long def-use problems: training draws 5..HI, the "
                        "long def-use evaluation LO..HI (default: the generator's 17-21)")
    p.add_argument("--label-offsets", type=int, default=1,
                   help="once long problems are on, start the labels of short problems at a "
                        "random letter (1) or always at A (0)")
    p.add_argument("--init-from", default="",
                   help="start from the weights of this checkpoint directory (same shapes) "
                        "instead of a random initialization")
    p.add_argument("--at", action="append", default=[], metavar="STEP:KEY=VALUE[,KEY=VALUE]",
                   help="change numeric options from STEP on (replays a run whose options "
                        "were changed on resume), e.g. --at 2951:total_tokens=30e6")
    p.add_argument("--role-weight", action="append", default=[], metavar="ROLE=W",
                   help="weight of one role's tokens in the loss (repeatable; default 1), e.g. "
                        "V=8: rare roles (def-use's computed and re-read codes are < 1 %% of "
                        "the tokens) get more of the gradient")
    p.add_argument("--batch-tokens", type=int, default=2048, help="tokens per optimiser step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--min-lr-frac", type=float, default=0.05,
                   help="final learning rate as a fraction of the peak (cosine)")
    p.add_argument("--warmup-steps", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    p.add_argument("--total-tokens", type=float, default=35e6, help="length of the LR schedule")
    p.add_argument("--deadline", default="", help="UTC HH:MM: save and stop at this time")
    p.add_argument("--stop-step", type=int, default=0,
                   help="save and stop after this optimizer step (reproduces a run that was "
                        "stopped by --deadline; its step is in config.json)")
    p.add_argument("--save-every-min", type=float, default=10.0,
                   help="minutes between checkpoints")
    p.add_argument("--eval-every", type=int, default=200,
                   help="steps between quick evals (they also open the curriculum gate)")
    p.add_argument("--threads", type=int, default=1, help="torch compute threads")
    p.add_argument("--eval-split", default="",
                   help="only evaluate the checkpoint in --out on this split file and exit")
    args = p.parse_args()
    if args.eval_split:
        torch.set_num_threads(args.threads)
        print(json.dumps(evaluate_split(args.out, args.eval_split)))
        return 0

    torch.set_num_threads(args.threads)
    role_w = torch.ones(len(ROLE_CODES) + 1)  # index -1 (prompt, padding) carries no loss
    for spec in args.role_weight:
        role, _, w = spec.partition("=")
        if role not in ROLE_CODES or not w:
            p.error(f"--role-weight {spec!r}: expected ROLE=W with ROLE one of {ROLE_CODES}")
        role_w[ROLE_CODES.index(role)] = float(w)
    torch.manual_seed(args.seed)
    rng = random.Random(f"train:{args.seed}")
    os.makedirs(args.run_dir, exist_ok=True)
    log = open(os.path.join(args.run_dir, "train.log"), "a")

    def emit(rec: dict) -> None:
        line = json.dumps(rec)
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    tasks = ["plan-exec"] + (["def-use"] if args.defuse_frac > 0 else [])
    tok = CharTokenizer.from_chars(task.ALPHABET)
    cfg = {"hidden_size": args.hidden, "intermediate_size": args.ffn,
           "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
           "num_key_value_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
           "rope_theta": args.rope_theta, "rms_norm_eps": 1e-5, "vocab_size": tok.vocab_size,
           "max_position_embeddings": 2048, "tie_word_embeddings": False}
    assert args.heads % args.kv_heads == 0 and args.heads // args.kv_heads >= 2
    model = TinyLlama(cfg)
    decay = [p_ for n, p_ in model.named_parameters() if p_.dim() >= 2]
    no_decay = [p_ for n, p_ in model.named_parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    step, tokens_seen, best, elapsed0, long_on = 0, 0.0, -1.0, 0.0, False
    state_path = os.path.join(args.run_dir, "state.pt")
    if args.resume:
        if os.path.exists(state_path):
            st = torch.load(state_path)
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
            step, tokens_seen, best = st["step"], st["tokens_seen"], st["best"]
            long_on = st.get("long_on", True)
            elapsed0 = st.get("elapsed", 0.0)
            rng.setstate(st["rng"])
            torch.set_rng_state(st["torch_rng"])
        else:
            model.load_state_dict(load_safetensors_f32(os.path.join(args.out,
                                                                    "model.safetensors")))
        emit({"event": "resume", "step": step, "tokens_seen": tokens_seen, "best": best})
    elif args.init_from:
        model.load_state_dict(load_safetensors_f32(os.path.join(args.init_from,
                                                                "model.safetensors")))
        emit({"event": "init_from", "dir": args.init_from})
    n_params = sum(p_.numel() for p_ in model.parameters())
    emit({"event": "start", "params": n_params, "config": cfg, "args": vars(args)})

    d = task.Difficulty()
    short_eval = eval_batches(tok, args.seed, 64, 1, 4, args, 32)
    long_eval = eval_batches(tok, args.seed, 48, d.min_steps, d.max_steps, args, 8)
    if "def-use" in tasks:
        du_short = eval_batches(tok, args.seed, 64, 1, 4, args, 32, "def-use")
        du_long = eval_batches(tok, args.seed, 48, *args.defuse_steps, args, 8, "def-use")

    def evaluate_all(long_batches: int | None) -> tuple[dict, dict]:
        """(long, short) results; with def-use on, each also carries the def-use figures
        under "defuse" and "exact" is the lower of the two tasks' exact-trace rates."""
        ev = evaluate(model, long_eval[:long_batches])
        evs = evaluate(model, short_eval)
        if "def-use" in tasks:
            du = evaluate(model, du_long[:long_batches])
            dus = evaluate(model, du_short)
            ev = {**ev, "exact": min(ev["exact"], du["exact"]), "plan_exec_exact": ev["exact"],
                  "defuse": du}
            evs = {**evs, "defuse": dus}
        return ev, evs

    def gate_open(evs: dict) -> bool:
        accs = [evs["acc_P"], evs["acc_R"]]
        if "defuse" in evs:
            accs += [evs["defuse"]["acc_R"], evs["defuse"].get("acc_T", 1.0)]
        return min(accs) >= args.gate
    deadline = None
    if args.deadline:
        hh, mm = map(int, args.deadline.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        deadline = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
        if deadline < now:
            deadline += dt.timedelta(days=1)

    def lr_at(tokens: float) -> float:
        if step < args.warmup_steps:
            return args.lr * (step + 1) / args.warmup_steps
        frac = min(1.0, tokens / args.total_tokens)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 *
                          (1 + math.cos(math.pi * frac)))

    def checkpoint(final: bool) -> None:
        nonlocal best
        ev, evs = evaluate_all(None)
        elapsed = elapsed0 + time.time() - t0
        info = {"step": step, "tokens_seen": int(tokens_seen), "train_seconds": round(elapsed),
                "seed": args.seed, "eval_long_exact": ev["exact"]}
        saved = ev["exact"] >= best
        if saved:
            best = ev["exact"]
            write_checkpoint(args.out, model, tok, info, tasks)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "tokens_seen": tokens_seen, "best": best, "elapsed": elapsed,
                    "long_on": long_on,
                    "rng": rng.getstate(), "torch_rng": torch.get_rng_state()},
                   state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)
        emit({"event": "checkpoint", "final": final, "saved_to_out": saved, **info,
              "long": ev, "short": evs})

    t0 = time.time()
    last_save = time.time()
    run_loss, run_tok, t_log = 0.0, 0, time.time()
    changes = []
    for spec in args.at:
        at_step, assigns = spec.split(":", 1)
        for assign in assigns.split(","):
            key, value = assign.split("=")
            if not hasattr(args, key):
                p.error(f"--at {spec}: unknown option {key!r}")
            changes.append((int(at_step), key, type(getattr(args, key))(float(value))))
    while True:
        for at_step, key, value in changes:
            if step >= at_step and getattr(args, key) != value:
                setattr(args, key, value)
                emit({"event": "option", "step": step, key: value})
        if tokens_seen >= args.total_tokens:
            break
        ids, tgt, roles = make_batch(rng, long_on, args, tok)
        for g in opt.param_groups:
            g["lr"] = lr_at(tokens_seen)
        logits = model(ids)
        if args.role_weight:
            ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1),
                                 ignore_index=-100, reduction="none")
            w = role_w[roles.view(-1)] * (tgt.view(-1) != -100)
            loss = (ce * w).sum() / w.sum()
        else:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1),
                                   ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ntok = ids.numel()
        tokens_seen += ntok
        run_loss += float(loss) * ntok
        run_tok += ntok
        if step % args.eval_every == 0:
            ev, evs = evaluate_all(2)
            now = time.time()
            emit({"event": "train", "step": step, "tokens_seen": int(tokens_seen),
                  "minutes": round((elapsed0 + now - t0) / 60, 2),
                  "loss": round(run_loss / run_tok, 5), "lr": round(lr_at(tokens_seen), 6),
                  "tok_per_s": round(run_tok / (now - t_log)), "long_on": long_on,
                  "long_quick": ev, "short_quick": evs})
            run_loss, run_tok, t_log = 0.0, 0, now
            if not long_on and (gate_open(evs) or tokens_seen >= args.short_tokens_max):
                long_on = True
                emit({"event": "curriculum", "long_on": True, "step": step,
                      "tokens_seen": int(tokens_seen)})
        if time.time() - last_save > args.save_every_min * 60:
            checkpoint(final=False)
            last_save = time.time()
        if args.stop_step and step >= args.stop_step:
            break
        if deadline and dt.datetime.now(dt.timezone.utc) >= deadline:
            emit({"event": "deadline"})
            break
    checkpoint(final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
