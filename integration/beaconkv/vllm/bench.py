"""``python -m beaconkv.vllm.bench``: vLLM's own throughput harness with BeaconKV as the cache.

Takes every flag of ``vllm bench throughput`` (``vllm.benchmarks.throughput``) plus
``--policy`` (``stock`` = vLLM's own cache, or a BeaconKV policy: ``full``, ``beacon``, ...),
``--budget``, ``--knob NAME=VALUE`` (repeatable) and ``--block-tokens`` (tokens per block of
our pool). ``--dataset-name reasoning`` draws prompts from the model directory's dev problems
(``data/dev.jsonl``; output length = the reference output's length + eos). Prints vLLM's
"Throughput:" line, then max/mean running batch, preemptions and peak KV blocks; with
``--output-json`` those join vLLM's keys in the JSON file, with the output tokens/s and token
counts vLLM prints but does not write.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile

from . import config as _config

# What vLLM's harness prints and leaves out of its JSON.
_PRINTED = {
    "output_tokens_per_second": (float, r"^Throughput: .*, ([\d.]+) output tokens/s$"),
    "total_prompt_tokens": (int, r"^Total num prompt tokens:\s+(\d+)$"),
    "total_output_tokens": (int, r"^Total num output tokens:\s+(\d+)$"),
}


class _Tee(io.TextIOBase):
    """Writes through to `out` and keeps a copy."""

    def __init__(self, out):
        self.out, self.copy = out, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def printed_numbers(stdout: str) -> dict:
    """The numbers of vLLM's report that its JSON does not have, from what it printed."""
    out = {}
    for key, (kind, pattern) in _PRINTED.items():
        m = re.search(pattern, stdout, re.M)
        if m is None:
            raise RuntimeError(f"beaconkv.vllm.bench: vLLM's report has no {key}")
        out[key] = kind(m.group(1))
    return out


def _reasoning_requests(args):
    """SampleRequests from the dev problems of the model directory."""
    from vllm.benchmarks.datasets import SampleRequest

    from beaconkv.evaluate import load_problems
    from beaconkv.tokenizer import CharTokenizer

    tok = CharTokenizer.load(args.model)
    problems = load_problems(args.model, "dev")
    out = []
    for i in range(args.num_prompts):
        p = problems[i % len(problems)]
        ids = [tok.bos_id] + tok.encode(p["prompt"])
        out.append(SampleRequest(prompt={"prompt_token_ids": ids}, prompt_len=len(ids),
                                 expected_output_len=len(tok.encode(p["target"])) + 1))
    return out


def build_parser():
    from vllm.benchmarks import throughput
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    throughput.add_cli_args(parser)
    g = parser.add_argument_group("BeaconKV")
    g.add_argument("--policy", default="beacon",
                   help="stock (vLLM's own KV cache) or a BeaconKV policy spec "
                        "NAME[-pooled][:KNOB=VALUE,...]; 'model': the setting the model "
                        "ships (its config.json's beaconkv_policy)")
    g.add_argument("--budget", type=int, default=None, help="tokens kept per head")
    g.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="policy knob (repeatable), e.g. --knob interval=16")
    g.add_argument("--block-tokens", type=int, default=_config.VllmConfig.block_size,
                   help="tokens per block of the BeaconKV pool (default %(default)s)")
    g.add_argument("--layout", choices=["single", "multiprocess"], default="single",
                   help="single: scheduler and model in one process; multiprocess: vLLM's "
                        "default layout (EngineCore and worker processes, our pools kept in step "
                        "by the BeaconKV KV connector)")
    g.add_argument("--scorer", choices=["host", "paged"], default="host",
                   help="host: each sequence's policy scores its heads; paged: every planned head "
                        "of a step in one call to the GPU pipeline's CPU twin (docs/gpu.md)")
    g.add_argument("--admission", choices=["reserve", "optimistic"], default="reserve",
                   help="reserve: admit a request only when its peak KV under the policy fits "
                        "(no preemption for policies that bound every head); optimistic: "
                        "vLLM's rule (room for the prompt), preempting when the pool runs out")
    return parser


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    reasoning = False
    for i, a in enumerate(argv):
        if a == "--dataset-name" and i + 1 < len(argv) and argv[i + 1] == "reasoning":
            argv[i + 1], reasoning = "random", True
        elif a == "--dataset-name=reasoning":
            argv[i], reasoning = "--dataset-name=random", True
    args = build_parser().parse_args(argv)
    # single: the scheduler and the model share one pool; multiprocess: each process has its
    # own, kept in step by the connector (docs/vllm.md).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if args.layout == "single" else "1"
    if args.policy == "stock":
        os.environ.pop("BEACONKV_VLLM_CONFIG", None)
    else:
        from . import config

        # "model": the policy name "model" reads the served model's directory.
        cfg = {"policy": args.policy, "budget": args.budget, "knobs": args.knob or [],
               "block_size": args.block_tokens, "admission": args.admission,
               "scorer": args.scorer, "model": args.model}
        config.parse(json.dumps(cfg))  # unknown policy / knob: error before vLLM starts
        os.environ[config.ENV] = json.dumps(cfg)
        from . import register

        register()  # vLLM may have loaded its plugins already (while building the parser)
    # Same scheduler class both ways, so stock runs report the same statistics.
    args.scheduler_cls = "beaconkv.vllm.Scheduler"
    if args.policy != "stock":
        args.enable_prefix_caching = False
        if args.layout == "multiprocess":
            from vllm.config import KVTransferConfig

            from .connector import kv_transfer_config

            args.kv_transfer_config = KVTransferConfig(**kv_transfer_config())

    from vllm.benchmarks import throughput

    from .scheduler import STATS_FILE_ENV

    if reasoning:
        throughput.get_requests = lambda a, tokenizer: _reasoning_requests(a)
    with tempfile.TemporaryDirectory() as tmp:
        # The scheduler (in the EngineCore process when multiprocess) writes its statistics
        # here when it runs out of requests.
        stats_file = os.path.join(tmp, "stats.json")
        os.environ[STATS_FILE_ENV] = stats_file
        tee = _Tee(sys.stdout)
        try:
            with contextlib.redirect_stdout(tee):
                throughput.main(args)
        finally:
            os.environ.pop(STATS_FILE_ENV, None)
        if not os.path.exists(stats_file):
            raise RuntimeError("beaconkv.vllm.bench: the scheduler wrote no statistics")
        with open(stats_file) as f:
            s = json.load(f)
    steps = max(1, s.get("steps", 0))
    extra = {"policy": args.policy, "budget": args.budget, "knobs": args.knob,
             "layout": args.layout,
             "admission": args.admission if args.policy != "stock" else None,
             "max_running": s["max_running"], "mean_running": s["running_sum"] / steps,
             "preemptions": s["preemptions"], "peak_kv_blocks": s["peak_kv_blocks"],
             "pool_blocks": s["pool_blocks"],
             "peak_kv_mib": s["peak_kv_blocks"] * s["block_bytes"] / 2**20,
             "kv_block_tokens": args.block_tokens if args.policy != "stock" else None,
             **printed_numbers(tee.copy.getvalue())}
    for k in ("tokens_evicted", "blocks_freed_by_eviction", "compressions"):
        if k in s:
            extra[k] = s[k]
    print(f"Running batch: max {extra['max_running']}, mean {extra['mean_running']:.2f}; "
          f"preemptions: {extra['preemptions']}; peak KV blocks: {extra['peak_kv_blocks']} "
          f"of {extra['pool_blocks']} ({extra['peak_kv_mib']:.1f} MiB)")
    if args.output_json:
        with open(args.output_json) as f:
            data = json.load(f)
        data.update(extra)
        with open(args.output_json, "w") as f:
            json.dump(data, f, indent=4)
    return extra


def _exec_with_spin_count() -> None:
    """Runs this command again with GOMP_SPINCOUNT set when it is not (see SPIN_ENV)."""
    from . import SPIN_ENV, SPIN_COUNT

    if SPIN_ENV in os.environ:
        return
    env = dict(os.environ, **{SPIN_ENV: SPIN_COUNT})
    os.execve(sys.executable, [sys.executable, "-m", "beaconkv.vllm.bench", *sys.argv[1:]], env)


if __name__ == "__main__":
    # libgomp reads its spin count when it loads, and ours loaded with `import beaconkv`, so
    # the variable must be in the environment before the interpreter starts.
    _exec_with_spin_count()
    main()
