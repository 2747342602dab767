"""Accuracy and memory of a policy on a split of the tiny reasoner's task (``beaconkv eval``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, TextIO

from .task import extract_answer, read_split
from .tokenizer import CharTokenizer


def resolve_split(model_dir: str, split: str) -> str:
    """A split name (dev, test, heldout-<seed>: a file data/<name>.jsonl of the model) or a
    .jsonl path."""
    named = os.path.join(model_dir, "data", f"{split}.jsonl")
    path = named if os.sep not in split and os.path.isfile(named) else split
    if not os.path.isfile(path):
        raise ValueError(f"split {split!r}: no such file {path}")
    return path


def load_problems(model_dir: str, split: str, num: int | None = None) -> list[dict]:
    """The first `num` problems (all when None) of a split name or .jsonl path."""
    if num is not None and num < 1:
        raise ValueError(f"num must be >= 1 (or None for the whole split), got {num}")
    problems = read_split(resolve_split(model_dir, split))
    if num is not None:
        problems = problems[:num]
    if not problems:
        raise ValueError(f"split {split!r}: no problems to evaluate")
    return problems


@dataclass
class EvalResult:
    policy: str  # as named: NAME[-pooled][:KNOB=VALUE,...]
    budget: int | None  # tokens kept per head (rpc: period / ratio); None for full
    num_problems: int
    accuracy: float
    mean_generated_tokens: float
    peak_kv_tokens_per_seq: float
    full_kv_tokens_per_seq: float
    compression_ratio: float
    tokens_per_second: float
    wall_seconds: float
    preemptions: int
    out_of_memory: int  # requests the pool could not hold to the end (scored as wrong)
    engine_stats: dict
    policy_config: dict  # every knob of the configuration that ran
    # Per problem, in the split's order: its id (the record's "id", else its index) and
    # whether the answer was right; `beaconkv compare` pairs two runs by these.
    problem_ids: list[str]
    correct: list[bool]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Progress:
    """A one-line progress bar on a terminal stream (silent when `out` is None)."""

    def __init__(self, total: int, label: str, out: TextIO | None):
        self.total, self.label, self.out, self.done = total, label, out, 0
        self.start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.out is None:
            return
        tty = getattr(self.out, "isatty", lambda: False)()
        if not tty and self.done < self.total:
            return  # a log file gets the final line only
        width = 30
        filled = width * self.done // max(self.total, 1)
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        self.out.write(f"{chr(13) if tty else ''}{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                       f"{self.done}/{self.total} ({rate:.2f}/s)")
        if self.done >= self.total:
            self.out.write("\n")
        self.out.flush()


def evaluate(model_dir: str, split: str, policy: str, budget: int | None = None,
             num: int | None = None, max_batch: int = 16, block_size: int = 16,
             num_blocks: int = 0, preemption: str = "recompute", max_new_tokens: int = 0,
             progress: TextIO | None = None, policy_knobs: dict | list | None = None,
             on_output: Callable[[dict, dict], None] | None = None,
             interval: int | None = None, scorer: str = "host") -> EvalResult:
    """Greedy-decodes the first `num` problems of `split` with `policy` at `budget`.

    `scorer`: ``host`` (the policy scores in the engine) or ``paged`` (the device pipeline's
    CPU twin scores every due head of a step through the block tables).

    `policy` (``NAME[-pooled][:KNOB=VALUE,...]``), `budget`, `interval` and `policy_knobs` go
    to the core's registry (``beaconkv.make_policy_config``), as in every entry point."""
    import json

    import beaconkv

    problems = load_problems(model_dir, split, num)
    tok = CharTokenizer.load(model_dir)
    cfg = beaconkv.make_policy_config(policy, budget, interval=interval, knobs=policy_knobs,
                                      model=model_dir)
    engine = beaconkv.Engine(model_dir, policy=cfg, block_size=block_size,
                             num_blocks=num_blocks, max_batch=max_batch, preemption=preemption,
                             scorer=scorer)
    limit = max_new_tokens or 2 * max(len(p["target"]) for p in problems) + 16
    for i, p in enumerate(problems):
        engine.add_request(i, [tok.bos_id] + tok.encode(p["prompt"]), max_new_tokens=limit)
    bar = Progress(len(problems), f"eval {policy}", progress)
    start = time.perf_counter()
    outputs = []
    while engine.has_unfinished:
        done = engine.step()
        outputs.extend(done)
        if done:
            bar.update(len(done))
    wall = time.perf_counter() - start
    per_problem = [False] * len(problems)
    gen_tokens = 0
    peak = full = 0.0
    for out in outputs:
        p = problems[out["id"]]
        text = tok.decode(out["output"])
        ok = extract_answer(text) == p["answer"]
        per_problem[out["id"]] = ok
        gen_tokens += len(out["output"])
        peak += out["peak_retained_tokens"]
        full += out["prompt_len"] + len(out["output"])
        if on_output is not None:
            on_output(p, {**out, "text": text, "correct": ok})
    n = len(outputs)
    stats = json.loads(engine.stats_json())
    return EvalResult(
        policy=policy, budget=beaconkv.policy_budget(cfg), num_problems=n,
        accuracy=sum(per_problem) / n, mean_generated_tokens=gen_tokens / n,
        peak_kv_tokens_per_seq=peak / n, full_kv_tokens_per_seq=full / n,
        compression_ratio=full / peak if peak else 1.0,
        tokens_per_second=gen_tokens / wall if wall > 0 else 0.0, wall_seconds=wall,
        preemptions=stats["preemptions"]["recompute"] + stats["preemptions"]["swap"],
        out_of_memory=sum(o["finish_reason"] == "out_of_memory" for o in outputs),
        engine_stats=stats, policy_config=cfg.to_dict(),
        problem_ids=[str(p.get("id", i)) for i, p in enumerate(problems)], correct=per_problem)


def _log_softmax(x):
    import numpy as np

    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _forced_run(model_dir, problems, tok, policy_cfg, max_batch, block_size, num_blocks,
                preemption, progress, label):
    import json

    import beaconkv

    engine = beaconkv.Engine(model_dir, policy=policy_cfg, block_size=block_size,
                             num_blocks=num_blocks, max_batch=max_batch, preemption=preemption)
    for i, p in enumerate(problems):
        forced = tok.encode(p["target"]) + [tok.eos_id]
        engine.add_request(i, [tok.bos_id] + tok.encode(p["prompt"]), forced_output=forced,
                           return_logits=True, max_new_tokens=len(forced))
    bar = Progress(len(problems), label, progress)
    outs = {}
    start = time.perf_counter()
    while engine.has_unfinished:
        done = engine.step()
        for o in done:
            outs[o["id"]] = o
        if done:
            bar.update(len(done))
    return outs, time.perf_counter() - start, json.loads(engine.stats_json())


def evaluate_teacher_forced(model_dir: str, split: str, policy: str, budget: int | None = None,
                            num: int | None = None, max_batch: int = 16, block_size: int = 16,
                            num_blocks: int = 0, preemption: str = "recompute",
                            progress: TextIO | None = None,
                            policy_knobs: dict | list | None = None,
                            full_cache: dict | None = None,
                            interval: int | None = None) -> dict:
    """Feeds each problem's reference output and compares the policy's next-token
    distributions with the full cache's: greedy agreement, mean KL(full || policy), and
    accuracy on the retrieval tokens (those the generator marks as read from far back).

    `accuracy` here is the share of problems whose every target token is the policy's argmax;
    `full_retrieval_accuracy` is the full cache's own retrieval accuracy, for scale, and
    `retrieval_agreement` the share of retrieval tokens where the policy's argmax is the full
    cache's (what eviction changed, whether or not the model is right there).
    `full_cache`: a dict kept across calls (a study) so the full-cache run happens once per
    (model, split, problems, batching) instead of once per policy."""
    import numpy as np

    import beaconkv

    problems = load_problems(model_dir, split, num)
    tok = CharTokenizer.load(model_dir)
    # A bad knob fails before the full-cache run.
    cfg = beaconkv.make_policy_config(policy, budget, interval=interval, knobs=policy_knobs,
                                      model=model_dir)
    common = (max_batch, block_size, num_blocks, preemption, progress)
    key = (os.path.abspath(model_dir), split, len(problems), max_batch, block_size)
    if full_cache is not None and key in full_cache:
        full = full_cache[key]
    else:
        full, _, _ = _forced_run(model_dir, problems, tok, "full", *common, "full (reference)")
        if full_cache is not None:
            full_cache[key] = full
    outs, wall, stats = _forced_run(model_dir, problems, tok, cfg, *common, f"forced {policy}")
    oom = sorted(i for i, o in outs.items() if o["finish_reason"] == "out_of_memory")
    if oom:
        # A truncated run has no logits to compare past the point it stopped.
        raise ValueError(f"{len(oom)} of {len(problems)} teacher-forced requests ran out of KV "
                         f"memory (first: problem {oom[0]}); raise --kv-blocks")
    agree = kl_sum = 0.0
    positions = 0
    ret_hit = ret_full_hit = ret_agree = ret_total = exact = 0
    peak = full_len = 0.0
    for i, p in enumerate(problems):
        f_logits, q_logits = full[i]["logits"], outs[i]["logits"]
        target = np.asarray(tok.encode(p["target"]) + [tok.eos_id])
        f_arg, q_arg = f_logits.argmax(-1), q_logits.argmax(-1)
        agree += float((f_arg == q_arg).sum())
        lf, lq = _log_softmax(f_logits), _log_softmax(q_logits)
        kl_sum += float((np.exp(lf) * (lf - lq)).sum())
        positions += len(target)
        ret = np.asarray(p.get("retrieval", []), dtype=np.int64)
        ret_hit += int((q_arg[ret] == target[ret]).sum())
        ret_full_hit += int((f_arg[ret] == target[ret]).sum())
        ret_agree += int((q_arg[ret] == f_arg[ret]).sum())
        ret_total += len(ret)
        exact += bool((q_arg == target).all())
        peak += outs[i]["peak_retained_tokens"]
        full_len += outs[i]["prompt_len"] + len(target)
    n = len(problems)
    return {
        "policy": policy, "budget": beaconkv.policy_budget(cfg), "num_problems": n,
        "teacher_forced": True, "accuracy": exact / n,
        "mean_generated_tokens": positions / n,
        "peak_kv_tokens_per_seq": peak / n, "full_kv_tokens_per_seq": full_len / n,
        "compression_ratio": full_len / peak if peak else 1.0,
        "tokens_per_second": positions / wall if wall > 0 else 0.0, "wall_seconds": wall,
        "token_agreement": agree / positions, "mean_kl": kl_sum / positions,
        "retrieval_accuracy": ret_hit / ret_total if ret_total else float("nan"),
        "full_retrieval_accuracy": ret_full_hit / ret_total if ret_total else float("nan"),
        "retrieval_agreement": ret_agree / ret_total if ret_total else float("nan"),
        "preemptions": stats["preemptions"]["recompute"] + stats["preemptions"]["swap"],
        "out_of_memory": sum(o["finish_reason"] == "out_of_memory" for o in outs.values()),
        "engine_stats": stats, "policy_config": cfg.to_dict(),
    }
