"""Offline throughput at a fixed KV memory (``beaconkv bench throughput``), in vLLM's format.

Every request is queued before the first step, as ``vllm bench throughput`` does, and the engine
runs until all are done: what the policy frees becomes room for more running sequences, so the
numbers that matter are the running batch the pool reached and the tokens per second that
followed. Two datasets: ``reasoning`` (problems of the tiny reasoner's task; the model writes
its whole trace and the answers are checked) and ``random`` (random prompts, fixed output
lengths with eos ignored, vLLM's random dataset).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from .evaluate import Progress
from .task import Difficulty, extract_answer, split_examples
from .tokenizer import CharTokenizer


@dataclass
class BenchRequest:
    prompt: list[int]  # token ids, bos included
    max_new_tokens: int
    ignore_eos: bool
    answer: str | None = None  # reasoning: the expected final register


@dataclass
class ThroughputConfig:
    model: str
    num_prompts: int
    kv_blocks: int
    policy: str = "full"
    budget: int | None = None
    knobs: dict | list = field(default_factory=dict)  # {name: value} or ["NAME=VALUE", ...]
    dataset: str = "reasoning"
    input_len: int = 64
    output_len: int = 256
    random_range_ratio: float = 0.0
    preemption: str = "recompute"
    # reserve: a request is admitted only when its peak under a bounded policy fits (no
    # preemption); optimistic: vLLM's rule (its prompt fits now).
    admission: str = "reserve"
    seed: int = 0
    block_size: int = 16
    max_batch: int = 256
    num_threads: int = 1
    batch_invariant: bool = False

    def validate(self) -> None:
        checks = [("--num-prompts", self.num_prompts, 1), ("--kv-blocks", self.kv_blocks, 2),
                  ("--input-len", self.input_len, 1), ("--output-len", self.output_len, 1),
                  ("--block-size", self.block_size, 1), ("--max-batch", self.max_batch, 1),
                  ("--num-threads", self.num_threads, 1), ("--seed", self.seed, 0)]
        for name, value, low in checks:
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"--budget must be >= 1, got {self.budget}")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got "
                             f"{self.random_range_ratio}")
        if self.dataset not in ("reasoning", "random"):
            raise ValueError(f"--dataset must be 'reasoning' or 'random', got {self.dataset!r}")
        if self.admission not in ("reserve", "optimistic"):
            raise ValueError(f"--admission must be 'reserve' or 'optimistic', got "
                             f"{self.admission!r}")
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"--preemption must be 'recompute' or 'swap', got "
                             f"{self.preemption!r}")


def make_requests(cfg: ThroughputConfig, tok: CharTokenizer) -> list[BenchRequest]:
    """The benchmark's requests; the same (dataset, seed, lengths) give the same requests."""
    if cfg.dataset == "reasoning":
        reqs = []
        for ex in split_examples(cfg.seed, cfg.num_prompts, Difficulty()):
            # Room for the whole trace and its eos with some slack, as `beaconkv eval` allows.
            reqs.append(BenchRequest([tok.bos_id] + tok.encode(ex.prompt),
                                     2 * len(ex.target) + 16, False, ex.answer))
        return reqs
    rng = random.Random(f"random-dataset:{cfg.seed}")
    specials = {tok.bos_id, tok.eos_id, tok.pad_id}
    ids = [i for i in range(tok.vocab_size) if i not in specials]

    def length(mean: int) -> int:
        lo = max(1, int(mean * (1 - cfg.random_range_ratio)))
        return rng.randint(lo, int(mean * (1 + cfg.random_range_ratio)))

    reqs = []
    for _ in range(cfg.num_prompts):
        n_in, n_out = length(cfg.input_len), length(cfg.output_len)
        reqs.append(BenchRequest([tok.bos_id] + [rng.choice(ids) for _ in range(n_in - 1)],
                                 n_out, True))
    return reqs


def run_throughput(cfg: ThroughputConfig, progress: TextIO | None = None) -> dict:
    """Runs the benchmark; returns vLLM's JSON keys plus ours."""
    import beaconkv

    cfg.validate()
    tok = CharTokenizer.load(cfg.model)
    policy = beaconkv.make_policy_config(cfg.policy, cfg.budget, knobs=cfg.knobs,
                                         model=cfg.model)
    requests = make_requests(cfg, tok)
    engine = beaconkv.Engine(cfg.model, policy=policy, block_size=cfg.block_size,
                             num_blocks=cfg.kv_blocks, max_batch=cfg.max_batch,
                             preemption=cfg.preemption, admission=cfg.admission,
                             num_threads=cfg.num_threads,
                             batch_invariant=cfg.batch_invariant)
    # add_request refuses a prompt the pool can never hold: the error comes before any work.
    # What outgrows the pool later ends as out_of_memory, counted in the report.
    for i, r in enumerate(requests):
        try:
            engine.add_request(i, r.prompt, max_new_tokens=r.max_new_tokens,
                               ignore_eos=r.ignore_eos)
        except ValueError as e:
            raise ValueError(f"--kv-blocks {cfg.kv_blocks} is too small: {e}") from None
    bar = Progress(len(requests), f"bench {cfg.policy}", progress)
    outputs: dict[int, dict] = {}
    batches: list[int] = []  # running batch after each step
    start, cpu_start = time.perf_counter(), time.process_time()
    while engine.has_unfinished:
        done = engine.step()
        batches.append(engine.num_running)
        for o in done:
            outputs[o["id"]] = o
        if done:
            bar.update(len(done))
    elapsed = time.perf_counter() - start
    # CPU seconds of this process (all its threads): on a shared machine they count the work
    # done, where wall time also counts the waits for a core.
    cpu_seconds = time.process_time() - cpu_start
    stats = json.loads(engine.stats_json())

    prompt_tokens = sum(len(r.prompt) for r in requests)
    output_tokens = sum(len(o["output"]) for o in outputs.values())
    reasons: dict[str, int] = {}
    for o in outputs.values():
        reasons[o["finish_reason"]] = reasons.get(o["finish_reason"], 0) + 1
    correct = None
    if cfg.dataset == "reasoning":
        correct = sum(extract_answer(tok.decode(outputs[i]["output"])) == r.answer
                      for i, r in enumerate(requests))
    full_kv = sum(o["prompt_len"] + len(o["output"]) for o in outputs.values())
    peak_kv = sum(o["peak_retained_tokens"] for o in outputs.values())
    return {
        # vLLM's keys (benchmarks/throughput: elapsed_time ... tokens_per_second).
        "elapsed_time": elapsed,
        "num_requests": len(requests),
        "total_num_tokens": prompt_tokens + output_tokens,
        "requests_per_second": len(requests) / elapsed,
        "tokens_per_second": (prompt_tokens + output_tokens) / elapsed,
        # Ours.
        "output_tokens_per_second": output_tokens / elapsed,
        "cpu_seconds": cpu_seconds,
        "output_tokens_per_cpu_second": output_tokens / cpu_seconds if cpu_seconds > 0 else 0.0,
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": prompt_tokens,
        "policy": cfg.policy,
        "budget": beaconkv.policy_budget(policy),
        "knobs": cfg.knobs,
        "policy_config": policy.to_dict(),
        "dataset": cfg.dataset,
        "seed": cfg.seed,
        "kv_blocks": cfg.kv_blocks,
        "block_size": cfg.block_size,
        "max_batch": cfg.max_batch,
        "batch_invariant": cfg.batch_invariant,
        "num_threads": cfg.num_threads,
        "preemption_mode": cfg.preemption,
        "admission": cfg.admission,
        "max_running_batch": stats["peak_running"],
        "mean_running_batch": stats["mean_running"],
        # The first steps admit every short prompt at once, so the max says little about the
        # batch the pool sustains; the median over steps does.
        "median_running_batch": statistics.median(batches) if batches else 0,
        "preemptions": stats["preemptions"],
        "peak_used_blocks": stats["peak_used_blocks"],
        "mean_used_blocks": stats["mean_used_blocks"],
        "finish_reasons": reasons,
        "out_of_memory": reasons.get("out_of_memory", 0),
        "correct": correct,
        "accuracy": None if correct is None else correct / len(requests),
        "compression_ratio": full_kv / peak_kv if peak_kv else 1.0,
        "engine_stats": stats,
    }


def format_report(r: dict) -> str:
    """vLLM's "Throughput:" line first, then what the pool did."""
    t = r["engine_stats"]["time_seconds"]
    lines = [
        f"Throughput: {r['requests_per_second']:.2f} requests/s, "
        f"{r['tokens_per_second']:.2f} total tokens/s, "
        f"{r['output_tokens_per_second']:.2f} output tokens/s",
        f"Total num prompt tokens:  {r['total_prompt_tokens']}",
        f"CPU time: {r['cpu_seconds']:.2f} s for {r['elapsed_time']:.2f} s of wall time "
        f"({r['output_tokens_per_cpu_second']:.2f} output tokens per CPU second)",
        f"Total num output tokens:  {r['total_output_tokens']}",
        f"Running batch: max {r['max_running_batch']}, median {r['median_running_batch']:.0f}, "
        f"mean {r['mean_running_batch']:.1f} (limit {r['max_batch']})",
        f"Preemptions: recompute {r['preemptions']['recompute']}, "
        f"swap {r['preemptions']['swap']}",
        f"KV blocks: peak {r['peak_used_blocks']}, mean {r['mean_used_blocks']:.0f} of "
        f"{r['kv_blocks'] - 1} usable "
        f"(block size {r['block_size']}); compression {r['compression_ratio']:.2f}x",
        f"Out of memory: {r['out_of_memory']} request(s)",
        "Engine time (s): " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()),
    ]
    if r["accuracy"] is not None:
        lines.append(f"Answers: {r['correct']}/{r['num_requests']} exact "
                     f"({100 * r['accuracy']:.1f} %)")
    return "\n".join(lines)


def add_bench_parser(sub, default_model: str) -> None:
    """`beaconkv bench throughput ...`."""
    from .validate import float_arg, int_arg, knob_help, policy_help

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    t = bsub.add_parser(
        "throughput", help="offline throughput at a fixed KV memory (vLLM's format)",
        description=__doc__.split("\n\n")[0])
    d = ThroughputConfig(model="", num_prompts=0, kv_blocks=0)
    t.add_argument("--model", default=default_model, help="HF-style model directory")
    t.add_argument("--num-prompts", type=int_arg(1), default=64,
                   help="requests, all queued at once")
    t.add_argument("--kv-blocks", type=int_arg(2), required=True,
                   help="device pool size in blocks (one block: block-size tokens of one head)")
    t.add_argument("--policy", default=d.policy, help=policy_help())
    t.add_argument("--budget", type=int_arg(1), default=None,
                   help="KV tokens kept per head (rpc: period = ratio x budget)")
    t.add_argument("--knob", action="append", metavar="NAME=VALUE", help=knob_help())
    t.add_argument("--dataset", choices=["reasoning", "random"], default=d.dataset,
                   help="reasoning: the tiny reasoner's task, full traces, answers checked; "
                        "random: random prompts, fixed output lengths, eos ignored")
    t.add_argument("--input-len", type=int_arg(1), default=d.input_len,
                   help="random: prompt tokens")
    t.add_argument("--output-len", type=int_arg(1), default=d.output_len,
                   help="random: output tokens")
    t.add_argument("--random-range-ratio", type=float_arg(0.0, 0.999),
                   default=d.random_range_ratio,
                   help="random: lengths drawn uniformly from [L*(1-r), L*(1+r)]")
    t.add_argument("--preemption", choices=["recompute", "swap"], default=d.preemption,
                   help="what a preempted sequence does: recompute (re-prefill later) or swap "
                        "(to host memory and back)")
    t.add_argument("--admission", choices=["reserve", "optimistic"], default=d.admission,
                   help="reserve: admit a request only when its peak KV under the policy fits "
                        "(no preemption for policies that bound every head); optimistic: "
                        "vLLM's rule (its prompt fits now), preempting when the pool runs out")
    t.add_argument("--seed", type=int_arg(0), default=d.seed, help="dataset seed")
    t.add_argument("--block-size", type=int_arg(1), default=d.block_size,
                   help="token slots per KV block (one block: one head of one sequence)")
    t.add_argument("--max-batch", type=int_arg(1), default=d.max_batch,
                   help="most sequences running at once (vLLM's max_num_seqs)")
    t.add_argument("--num-threads", type=int_arg(1), default=d.num_threads,
                   help="compute threads")
    t.add_argument("--batch-invariant", action="store_true",
                   help="fixed-order dot products instead of GEMMs (slower; a sequence's "
                        "tokens do not depend on its batch)")
    t.add_argument("--output-json", help="write the result as JSON here")
    t.set_defaults(func=_cmd_bench_throughput)


def _cmd_bench_throughput(args) -> int:
    cfg = ThroughputConfig(
        model=args.model, num_prompts=args.num_prompts, kv_blocks=args.kv_blocks,
        policy=args.policy, budget=args.budget, knobs=args.knob or [],
        dataset=args.dataset, input_len=args.input_len, output_len=args.output_len,
        random_range_ratio=args.random_range_ratio, preemption=args.preemption,
        admission=args.admission, seed=args.seed,
        block_size=args.block_size, max_batch=args.max_batch, num_threads=args.num_threads,
        batch_invariant=args.batch_invariant)
    result = run_throughput(cfg, progress=sys.stderr)
    print(format_report(result))
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0
