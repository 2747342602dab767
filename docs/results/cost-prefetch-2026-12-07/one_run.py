# One engine run per repeat, as bench/engine_bench.py times it (first BATCH dev prompts, 512 new
# tokens, budget 128): python3 one_run.py BATCH THREADS POLICY REPEATS. Prints each run's
# attention, select, score and book milliseconds, decode milliseconds and machinery share.
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import beaconkv  # noqa: E402
from beaconkv.task import read_split  # noqa: E402
from beaconkv.tokenizer import CharTokenizer  # noqa: E402
from engine_bench import engine_run  # noqa: E402

model = os.path.join(ROOT, "models", "tiny-reasoner")
batch, threads, policy, repeats = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tag = os.environ.get("TAG", "")
tok = CharTokenizer.load(model)
problems = read_split(os.path.join(model, "data", "dev.jsonl"))
prompts = [[tok.bos_id] + tok.encode(p["prompt"]) for p in problems[:batch]]
config = beaconkv.make_policy_config(policy, 128, model=model)
for _ in range(repeats):
    r = engine_run(model, prompts, 512, config, threads)
    ms = [r[k] * r["decode_seconds"] * 1000 for k in
          ("attention_share", "selection_share", "scoring_share", "bookkeeping_share")]
    print(tag, *(f"{x:6.1f}" for x in ms), f"{r['decode_seconds'] * 1000:5.0f}",
          f"{100 * r['machinery_share']:.1f}%", flush=True)
