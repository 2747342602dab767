"""`beaconkv bench throughput`: vLLM's report format, datasets, and memory turned into batch."""

import json
import os
import re
import subprocess
import sys

import pytest

from beaconkv.throughput import ThroughputConfig, format_report, make_requests, run_throughput
from beaconkv.tokenizer import CharTokenizer

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")
VLLM_LINE = re.compile(r"^Throughput: \d+\.\d{2} requests/s, \d+\.\d{2} total tokens/s, "
                       r"\d+\.\d{2} output tokens/s$")
HEADS = 8  # tiny reasoner: 4 layers x 2 kv heads


def random_cfg(**kw) -> ThroughputConfig:
    base = dict(model=MODEL, num_prompts=6, kv_blocks=400, dataset="random", input_len=16,
                output_len=24)
    base.update(kw)
    return ThroughputConfig(**base)


def test_report_uses_vllm_format_and_keys():
    r = run_throughput(random_cfg())
    lines = format_report(r).splitlines()
    assert VLLM_LINE.match(lines[0]), lines[0]
    for key in ("elapsed_time", "num_requests", "total_num_tokens", "requests_per_second",
                "tokens_per_second"):
        assert key in r
    assert r["num_requests"] == 6
    assert r["total_prompt_tokens"] == 6 * 16 and r["total_output_tokens"] == 6 * 24
    assert r["total_num_tokens"] == 6 * (16 + 24)
    assert r["requests_per_second"] * r["elapsed_time"] == pytest.approx(6)
    assert r["tokens_per_second"] * r["elapsed_time"] == pytest.approx(6 * 40)
    assert r["finish_reasons"] == {"length": 6} and r["out_of_memory"] == 0
    assert r["accuracy"] is None  # random prompts have no answers
    assert r["max_running_batch"] == 6
    json.dumps(r)  # the JSON file is this dict


def test_random_dataset_is_seeded_and_respects_the_range_ratio():
    tok = CharTokenizer.load(MODEL)
    cfg = random_cfg(num_prompts=40, input_len=20, output_len=50, random_range_ratio=0.5)
    a, b = make_requests(cfg, tok), make_requests(cfg, tok)
    assert [(r.prompt, r.max_new_tokens) for r in a] == [(r.prompt, r.max_new_tokens) for r in b]
    other = make_requests(random_cfg(num_prompts=40, input_len=20, output_len=50,
                                     random_range_ratio=0.5, seed=1), tok)
    assert [r.prompt for r in other] != [r.prompt for r in a]
    assert all(10 <= len(r.prompt) <= 30 and 25 <= r.max_new_tokens <= 75 for r in a)
    assert len({len(r.prompt) for r in a}) > 1
    assert all(r.prompt[0] == tok.bos_id and r.ignore_eos for r in a)
    assert all(t not in (tok.bos_id, tok.eos_id, tok.pad_id) for r in a for t in r.prompt[1:])


def test_reasoning_dataset_checks_the_answers():
    r = run_throughput(ThroughputConfig(model=MODEL, num_prompts=2, kv_blocks=1500,
                                        dataset="reasoning"))
    assert r["accuracy"] is not None and r["correct"] == 2  # the full cache solves them
    assert r["finish_reasons"] == {"eos": 2}
    assert "Answers: 2/2 exact" in format_report(r)


def test_eviction_turns_freed_blocks_into_a_larger_batch():
    # 200 output tokens: a full sequence ends with 14 blocks per head (112 in all); the pool
    # holds two of them. streaming at budget 32 + interval 16 holds 3 blocks per head.
    common = dict(num_prompts=12, output_len=200, kv_blocks=1 + 2 * 14 * HEADS + HEADS,
                  preemption="swap", admission="optimistic")
    full = run_throughput(random_cfg(**common))
    evict = run_throughput(random_cfg(policy="streaming", budget=32, knobs={"interval": 16},
                                      **common))
    for r in (full, evict):
        assert r["out_of_memory"] == 0 and r["total_output_tokens"] == 12 * 200
        assert r["peak_used_blocks"] <= common["kv_blocks"] - 1
    assert full["median_running_batch"] <= 3
    assert evict["median_running_batch"] >= 3 * full["median_running_batch"]
    assert evict["mean_running_batch"] > 1.5 * full["mean_running_batch"]
    assert evict["compression_ratio"] > 3
    per_seq = {k: r["mean_used_blocks"] / r["mean_running_batch"] for k, r in
               (("full", full), ("evict", evict))}
    assert 0 < per_seq["evict"] <= 3 * HEADS + HEADS < per_seq["full"]
    # Reservation admission: at least as many sequences at once as fit at their peak (3
    # blocks per head: 232 // 24 = 9; more while some ramp up or near their end, as the pool's
    # future high point allows), none preempted, the pool never overrun, the same work done.
    reserved = run_throughput(random_cfg(policy="streaming", budget=32, knobs={"interval": 16},
                                         **{**common, "admission": "reserve"}))
    assert reserved["preemptions"] == {"recompute": 0, "swap": 0}
    assert reserved["max_running_batch"] >= (common["kv_blocks"] - 1) // (3 * HEADS)
    assert reserved["peak_used_blocks"] <= common["kv_blocks"] - 1
    assert reserved["total_output_tokens"] == 12 * 200 and reserved["out_of_memory"] == 0
    assert evict["preemptions"]["swap"] > 0


def test_a_pool_too_small_for_a_prompt_fails_before_any_work():
    with pytest.raises(ValueError, match="--kv-blocks 5 is too small.*needs"):
        run_throughput(random_cfg(kv_blocks=5))


def test_a_request_that_outgrows_the_pool_is_counted_out_of_memory():
    # The prompt fits (2 blocks per head), 100 output tokens would need 8 per head.
    r = run_throughput(random_cfg(num_prompts=1, output_len=100, kv_blocks=1 + 4 * HEADS))
    assert r["out_of_memory"] == 1 and r["finish_reasons"] == {"out_of_memory": 1}
    assert "Out of memory: 1 request(s)" in format_report(r)


@pytest.mark.parametrize("field,value,message", [
    ("num_prompts", 0, "--num-prompts must be >= 1"),
    ("kv_blocks", 0, "--kv-blocks must be >= 2"),
    ("random_range_ratio", 1.0, "--random-range-ratio"),
    ("budget", 0, "--budget must be >= 1"),
    ("dataset", "sharegpt", "--dataset"),
    ("admission", "greedy", "--admission must be 'reserve' or 'optimistic'"),
])
def test_bad_configuration_names_the_option(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        run_throughput(random_cfg(**{field: value}))


def test_cli_prints_the_line_and_writes_json(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "beaconkv.cli", "bench", "throughput", "--model", MODEL,
         "--num-prompts", "3", "--kv-blocks", "300", "--dataset", "random", "--input-len", "8",
         "--output-len", "12", "--policy", "beacon", "--budget", "64", "--knob", "interval=4",
         "--output-json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert VLLM_LINE.match(r.stdout.splitlines()[0])
    data = json.loads(out.read_text())
    assert data["policy"] == "beacon" and data["budget"] == 64 and data["knobs"] == ["interval=4"]
    assert data["policy_config"]["interval"] == 4 and data["policy_config"]["budget"] == 64
    bad = subprocess.run([sys.executable, "-m", "beaconkv.cli", "bench", "throughput",
                          "--model", MODEL, "--kv-blocks", "3"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1 and "--kv-blocks 3 is too small" in bad.stderr
