"""Runs one vLLM engine (stock, or with BeaconKV) on a JSON spec and writes a JSON result.

Used by test_vllm.py through a subprocess, so that each configuration gets a fresh process
(vLLM picks its attention backend and loads plugins once per process).

spec: {"model": DIR, "beaconkv": null | {"policy": ..., "budget": ..., "knobs": ...},
       "prompts": [[ids...], ...], "max_tokens": [n, ...], "ignore_eos": bool,
       "kv_cache_memory_bytes": int, "max_model_len": int, "logprobs": null | k,
       "multiprocess": bool (scheduler and model in separate processes, BeaconKVConnector)}
result: {"outputs": [[ids...], ...], "stats": {...}, "integrity": "ok" | message,
         "used_blocks_at_end": int}
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    multiprocess = spec.get("multiprocess", False)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    kw = {}
    if spec.get("beaconkv") is not None:
        os.environ["BEACONKV_VLLM_CONFIG"] = json.dumps(spec["beaconkv"])
        kw["scheduler_cls"] = "beaconkv.vllm.Scheduler"
        if multiprocess:
            from beaconkv.vllm.connector import kv_transfer_config

            kw["kv_transfer_config"] = kv_transfer_config()
    else:
        os.environ.pop("BEACONKV_VLLM_CONFIG", None)
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, seed=0,
              enable_prefix_caching=False, max_model_len=spec.get("max_model_len", 2048),
              kv_cache_memory_bytes=spec["kv_cache_memory_bytes"], **kw)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=spec.get("ignore_eos", False),
                             logprobs=spec.get("logprobs"))
              for m in spec["max_tokens"]]
    outs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params,
                        use_tqdm=False)
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outs]}
    if spec.get("logprobs"):  # per step: {token id: logprob} of the top tokens
        result["logprobs"] = [[{str(t): lp.logprob for t, lp in step.items()}
                               for step in o.outputs[0].logprobs] for o in outs]
    if spec.get("beaconkv") is not None and not multiprocess:
        from beaconkv.vllm import state

        st = state.get()
        result["stats"] = dict(st.stats)
        try:
            st.cache.verify_integrity()
            result["integrity"] = "ok"
        except Exception as e:  # reported, asserted by the test
            result["integrity"] = str(e)
        result["used_blocks_at_end"] = st.cache.num_used_blocks
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
