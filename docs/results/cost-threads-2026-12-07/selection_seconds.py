# Selection seconds per run at threads 1 and 2, median of 5, batches 1/8/32.
import json, sys, os, statistics
import beaconkv
from beaconkv.task import read_split
from beaconkv.tokenizer import CharTokenizer
m = '/work/main/models/tiny-reasoner'
pol = beaconkv.make_policy_config('beacon', 128, model=m)
tok = CharTokenizer.load(m)
probs = read_split(os.path.join(m, 'data', 'dev.jsonl'))
for batch in (1, 8, 32):
    prompts = [[tok.bos_id] + tok.encode(p['prompt']) for p in probs[:batch]]
    out = {}
    for th in (1, 2):
        sel = []
        for r in range(5):
            eng = beaconkv.Engine(m, policy=pol, max_batch=batch, num_threads=th)
            for i, p in enumerate(prompts):
                eng.add_request(i, p, max_new_tokens=512, ignore_eos=True)
            eng.run()
            s = json.loads(eng.stats_json())
            sel.append(s['time_seconds']['selection'])
        out[th] = statistics.median(sel)
    print(f"batch {batch}: select t1 {out[1]*1e3:.1f} ms  t2 {out[2]*1e3:.1f} ms  ratio {out[1]/out[2]:.2f}", flush=True)
