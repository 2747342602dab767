"""The engine's greedy tokens from the first four dev prompts (512 each, eos ignored, beacon at
budget 128) with the shipped model and its widened copies: python3 same_tokens.py MODEL COPY..."""
import json
import sys

import beaconkv
from beaconkv.task import read_split
from beaconkv.tokenizer import CharTokenizer

base = sys.argv[1]
tok = CharTokenizer.load(base)
problems = read_split(f"{base}/data/dev.jsonl")[:4]
runs = {}
for m in sys.argv[1:]:
    eng = beaconkv.Engine(m, policy=beaconkv.make_policy_config("beacon", 128, model=m),
                          max_batch=4, num_threads=1)
    for i, p in enumerate(problems):
        eng.add_request(i, [tok.bos_id] + tok.encode(p["prompt"]), max_new_tokens=512,
                        ignore_eos=True)
    runs[m] = ({r["id"]: r["output"] for r in eng.run()}, json.loads(eng.stats_json()))
ref_out, ref_stats = runs[base]
for m, (out, stats) in runs.items():
    same = sum(out[i] == ref_out[i] for i in ref_out)
    print(f"{m}: {sum(len(o) for o in out.values())} tokens, {same}/{len(ref_out)} outputs equal "
          f"to {base}'s; compressions {stats['compressions']}, evicted {stats['tokens_evicted']}")
