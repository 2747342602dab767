"""The ``beaconkv`` command line: generate, eval, compare, demo, analyze, bench throughput."""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_MODEL = os.path.join(os.path.dirname(__file__), "models", "tiny-reasoner")


def default_model_dir() -> str:
    """The shipped tiny model: installed with the package, or in the source tree."""
    for cand in (DEFAULT_MODEL,
                 os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")):
        if os.path.isfile(os.path.join(cand, "config.json")):
            return os.path.abspath(cand)
    return os.path.abspath("models/tiny-reasoner")


def _cmd_generate(args: argparse.Namespace) -> int:
    import beaconkv

    from .tokenizer import CharTokenizer

    tok = CharTokenizer.load(args.model)
    prompt = args.prompt.replace("\\n", "\n")
    policy = beaconkv.make_policy_config(args.policy, args.budget, knobs=args.knob,
                                         model=args.model)
    engine = beaconkv.Engine(args.model, policy=policy, allow_nonfinite=args.allow_nonfinite)
    engine.add_request(0, [tok.bos_id] + tok.encode(prompt), max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    out = engine.run()[0]
    sys.stdout.write(tok.decode(out["output"]))
    if not tok.decode(out["output"]).endswith("\n"):
        sys.stdout.write("\n")
    print(f"[{len(out['output'])} tokens, finish: {out['finish_reason']}, peak KV "
          f"{out['peak_retained_tokens']:.0f} tokens/head]", file=sys.stderr)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import beaconkv

    from .evaluate import evaluate, evaluate_teacher_forced

    kw = dict(num=args.num, max_batch=args.max_batch, block_size=args.block_size,
              num_blocks=args.kv_blocks, preemption=args.preemption, progress=sys.stderr,
              policy_knobs=args.knob)
    if args.teacher_forced:
        if args.scorer != "host":
            raise SystemExit("beaconkv eval: --teacher-forced runs the host scorer only")
        r = evaluate_teacher_forced(args.model, args.split, args.policy, args.budget, **kw)
    else:
        r = evaluate(args.model, args.split, args.policy, args.budget, scorer=args.scorer,
                     **kw).as_dict()
    line = (f"policy={r['policy']} budget={r['budget']} problems={r['num_problems']} "
            f"accuracy={r['accuracy']:.3f} mean_generated={r['mean_generated_tokens']:.0f} "
            f"peak_kv/seq={r['peak_kv_tokens_per_seq']:.0f} "
            f"compression={r['compression_ratio']:.2f}x tokens/s={r['tokens_per_second']:.0f}")
    if beaconkv.names_model_policy(args.policy):
        line += f" model_policy={beaconkv.model_policy_spec(args.model)}"
    if args.teacher_forced:
        line += (f" token_agreement={r['token_agreement']:.4f} "
                 f"retrieval_accuracy={r['retrieval_accuracy']:.4f} mean_kl={r['mean_kl']:.5f}")
    if r["out_of_memory"]:
        line += f" out_of_memory={r['out_of_memory']}"
    print(line)
    if r["out_of_memory"]:
        print(f"beaconkv eval: {r['out_of_memory']} of {r['num_problems']} requests ran out of KV "
              f"memory and are scored as wrong; raise --kv-blocks", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    return 0


def _load_per_problem(path: str) -> tuple[list[str], list[bool]]:
    """The problem ids and per-problem correctness of a ``beaconkv eval --json`` file."""
    try:
        with open(path, encoding="utf-8") as f:
            r = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    ids, correct = (r.get("problem_ids"), r.get("correct")) if isinstance(r, dict) else (None, None)
    if not isinstance(ids, list) or not isinstance(correct, list):
        raise ValueError(f"{path}: no per-problem results (problem_ids and correct, as "
                         f"'beaconkv eval --json' writes them for a greedy run)")
    if len(ids) != len(correct):
        raise ValueError(f"{path}: {len(ids)} problem_ids but {len(correct)} correct entries")
    if not ids:
        raise ValueError(f"{path}: a run of no problems")
    bad = next((i for i, c in enumerate(correct) if not isinstance(c, bool)), None)
    if bad is not None:
        raise ValueError(f"{path}: correct[{bad}] = {correct[bad]!r} is not true or false")
    return ids, correct


def _cmd_compare(args: argparse.Namespace) -> int:
    from .stats import paired, wilson

    files = args.runs
    if len(files) % 2:
        raise ValueError(f"runs come in pairs (reference, other); got {len(files)} files")
    a_all, b_all = [], []

    def line(label: str, c) -> str:
        lo, hi = c.difference_interval()
        ia, ib = wilson(c.correct_a / c.n, c.n), wilson(c.correct_b / c.n, c.n)
        return (f"{label}n={c.n} a={c.correct_a / c.n:.4f} [{ia[0]:.3f}, {ia[1]:.3f}] "
                f"b={c.correct_b / c.n:.4f} [{ib[0]:.3f}, {ib[1]:.3f}] "
                f"b-a={100 * c.difference:+.2f} pt [{100 * lo:+.2f}, {100 * hi:+.2f}] "
                f"lost={c.lost} gained={c.gained} mcnemar_p={c.p_value:.2g}")

    for fa, fb in zip(files[::2], files[1::2]):
        ids_a, ca = _load_per_problem(fa)
        ids_b, cb = _load_per_problem(fb)
        if ids_a != ids_b:
            diff = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y),
                        min(len(ids_a), len(ids_b)))
            raise ValueError(f"{fa} and {fb} are not runs of the same problems ({len(ids_a)} "
                             f"and {len(ids_b)} problems; they first differ at position {diff})")
        a_all += ca
        b_all += cb
        if len(files) > 2:
            print(line(f"{fa} {fb}: ", paired(ca, cb)))
    print(line("all: " if len(files) > 2 else "", paired(a_all, b_all)))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_block_manager_demo, run_demo

    if args.block_manager:
        run_block_manager_demo(seed=0, out=sys.stdout)
    else:
        run_demo(args.model, num=args.num, budget=args.budget, out=sys.stdout)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .validate import UINT64_MAX, float_arg, int_arg, knob_help, policy_help, split_help

    parser = argparse.ArgumentParser(prog="beaconkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, policy_default: str = "full") -> None:
        p.add_argument("--model", default=default_model_dir(), help="HF-style model directory")
        p.add_argument("--policy", default=policy_default, help=policy_help())
        p.add_argument("--budget", type=int_arg(1), default=None,
                       help="KV tokens kept per head (rpc: period = ratio x budget)")
        p.add_argument("--knob", action="append", metavar="NAME=VALUE", help=knob_help())

    g = sub.add_parser("generate", help="generate text for one prompt")
    common(g)
    g.add_argument("--prompt", required=True, help="prompt text (\\n for newlines)")
    g.add_argument("--max-new-tokens", type=int_arg(1), default=2048,
                   help="most tokens to generate")
    g.add_argument("--temperature", type=float_arg(0.0, 1e6), default=0.0,
                   help="sampling temperature; 0 = greedy")
    g.add_argument("--top-p", type=float_arg(0.0, 1.0, lo_open=True), default=1.0,
                   help="nucleus sampling mass, in (0, 1]")
    g.add_argument("--seed", type=int_arg(0, UINT64_MAX), default=0, help="sampling seed")
    g.add_argument("--allow-nonfinite", action="store_true",
                   help="load NaN/Inf weights with a warning instead of failing")
    g.set_defaults(func=_cmd_generate)

    e = sub.add_parser("eval", help="accuracy and KV memory of a policy on a split")
    common(e)
    e.add_argument("--split", default="dev", help=split_help(default_model_dir()))
    e.add_argument("--num", type=int_arg(1), default=None, help="first K problems only")
    e.add_argument("--max-batch", type=int_arg(1), default=16,
                   help="most sequences running at once")
    e.add_argument("--block-size", type=int_arg(1), default=16,
                   help="token slots per KV block (one block: one head of one sequence)")
    e.add_argument("--kv-blocks", type=int_arg(0), default=0, help="device pool size (0 = ample)")
    e.add_argument("--preemption", choices=["recompute", "swap"], default="recompute",
                   help="what a preempted sequence does: recompute (re-prefill later) or swap "
                        "(to host memory and back)")
    e.add_argument("--scorer", choices=["host", "paged"], default="host",
                   help="where compressions score and select: host (the policy, the reference) "
                        "or paged (the GPU pipeline's CPU twin over the block tables, all due "
                        "heads of a step in one call)")
    e.add_argument("--json", help="write the result as JSON here")
    e.add_argument("--teacher-forced", action="store_true",
                   help="feed the reference outputs; compare with the full cache")
    e.set_defaults(func=_cmd_eval)

    c = sub.add_parser(
        "compare", help="paired comparison of eval runs on the same problems",
        description="Paired comparison of 'beaconkv eval --json' runs of two settings on the same "
                    "problems: each accuracy with its 95 % Wilson interval, the difference (b - a) "
                    "with its 95 % interval, the problems b lost and gained, and the exact "
                    "McNemar p. Several pairs (one per split) are also pooled.")
    c.add_argument("runs", nargs="+", metavar="RUN.json",
                   help="pairs of eval JSON files: reference (a), then other (b), per split")
    c.set_defaults(func=_cmd_compare)

    d = sub.add_parser("demo", help="the main job: full cache vs BeaconKV vs a baseline")
    d.add_argument("--model", default=default_model_dir(), help="HF-style model directory")
    d.add_argument("--num", type=int_arg(1), default=24, help="dev problems to evaluate")
    d.add_argument("--budget", type=int_arg(1), default=None,
                   help="KV tokens kept per head by beacon and snapkv (default 128)")
    d.add_argument("--block-manager", action="store_true",
                   help="narrate the block manager's mechanics instead")
    d.set_defaults(func=_cmd_demo)

    from .analyze_cli import add_analyze_parser
    from .throughput import add_bench_parser

    add_analyze_parser(sub, default_model_dir())
    add_bench_parser(sub, default_model_dir())
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, MemoryError, RuntimeError, OSError) as e:
        print(f"beaconkv {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
