import sys, os, json, time
import beaconkv
from beaconkv.task import read_split
from beaconkv.tokenizer import CharTokenizer
model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models", "tiny-reasoner")
batch = int(sys.argv[1]); spec = sys.argv[2]; reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
budget = int(os.environ.get("BUDGET", "128"))
policy = beaconkv.make_policy_config(spec, budget)
tok = CharTokenizer.load(model)
problems = read_split(os.path.join(model, "data", "dev.jsonl"))
prompts = [[tok.bos_id] + tok.encode(p["prompt"]) for p in problems[:batch]]
res = []
for r in range(reps):
    eng = beaconkv.Engine(model, policy=policy, max_batch=batch, num_threads=1)
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_new_tokens=512, ignore_eos=True)
    t0 = time.perf_counter(); eng.run(); wall = time.perf_counter() - t0
    s = json.loads(eng.stats_json()); t = s["time_seconds"]
    dec = wall - t["prefill"]
    mach = t["bookkeeping"] + t["scoring"] + t["selection"] + t["compaction"]
    res.append((s["generated_tokens"]/dec, mach/dec, t["selection"]/dec, t["scoring"]/dec, t["compaction"]/dec))
for x in res: print("tok/s %.0f mach %.1f%% sel %.1f%% score %.1f%% compact %.1f%%" % (x[0], 100*x[1], 100*x[2], 100*x[3], 100*x[4]))
