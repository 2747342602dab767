# Decode seconds of one engine run per line: python3 decode_seconds.py BATCH THREADS POLICY REPEATS
# (the bench's engine_run on the first BATCH dev prompts, 512 new tokens, budget 128). The
# "nine runs alternated in threes" of the README: three calls of `... 32 2 beacon 3` per build.
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
tok = CharTokenizer.load(model)
problems = read_split(os.path.join(model, "data", "dev.jsonl"))
prompts = [[tok.bos_id] + tok.encode(p["prompt"]) for p in problems[:batch]]
config = beaconkv.make_policy_config(policy, 128, model=model)
for _ in range(repeats):
    print(f"{engine_run(model, prompts, 512, config, threads)['decode_seconds']:.3f}", flush=True)
