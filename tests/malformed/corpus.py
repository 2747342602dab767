"""The malformed-input corpus: model files, split files, CLI arguments and Python API calls that
a hostile or careless user could give BeaconKV, each with the exception class and message
fragment it must produce.

Each case is ``Case(name, expected_class, fragment, action)``; ``action(workdir)`` builds its
inputs under ``workdir`` and performs the call. A CLI case raises ``CliExit`` carrying the exit
status and stderr. ``main`` runs the cases in a worker process under an address-space limit
(RLIMIT_AS, like ``ulimit -v``) and a per-case alarm, writing one JSON line per case, so a crash
or hang is attributed to its case (tests/python/test_malformed_inputs.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from typing import Callable

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "tiny-reasoner")
ADDRESS_SPACE_LIMIT = 3 * 1024**3  # bytes; the tiny model and numpy need well under 1 GiB
CASE_TIMEOUT_S = 60  # a case that takes this long hangs


class CliExit(Exception):
    """A CLI run that did not succeed: ``exit <status>: <stderr>``."""


@dataclass
class Case:
    name: str
    expected: str  # exception class name
    fragment: str  # must occur in the message
    action: Callable[[str], object]


# ---------------------------------------------------------------- helpers


def _read_safetensors(path: str = os.path.join(MODEL, "model.safetensors")):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _safetensors_bytes(header, data: bytes, header_text: str | None = None) -> bytes:
    text = (header_text if header_text is not None else json.dumps(header)).encode()
    return struct.pack("<Q", len(text)) + text + data


def _model_dir(work: str, *, config=None, safetensors: bytes | None = None,
               tokenizer=None, drop: tuple[str, ...] = ()) -> str:
    """A copy of the shipped model with some files replaced (str/bytes/dict) or dropped."""
    d = os.path.join(work, "model")
    os.makedirs(d, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if name not in drop:
            shutil.copy(os.path.join(MODEL, name), d)
    for name, content in (("config.json", config), ("tokenizer.json", tokenizer)):
        if content is None:
            continue
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
    if safetensors is not None:
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(safetensors)
    for name in drop:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(d, name))
    return d


def _config(**changes):
    with open(os.path.join(MODEL, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    for k, v in changes.items():
        if v is _DELETE:
            c.pop(k, None)
        else:
            c[k] = v
    return c


def _tokenizer(**changes):
    with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    t.update(changes)
    return t


def _tokenizer_model(**changes):
    """tokenizer.json with fields of its "model" (the WordLevel vocabulary) changed."""
    t = _tokenizer()
    t["model"].update(changes)
    return t


def _tokenizer_vocab(add=None, drop=None):
    """tokenizer.json with entries added to / dropped from model.vocab (token -> id)."""
    t = _tokenizer()
    vocab = t["model"]["vocab"]
    if drop is not None:
        del vocab[drop]
    vocab.update(add or {})
    return t


_DELETE = object()


def _engine(model_dir: str, **kw):
    import beaconkv

    return beaconkv.Engine(model_dir, num_threads=1, **kw)


def _load_with_header(mutate: Callable[[dict], None] | None = None, *, data_mutate=None,
                      header_text: str | None = None):
    def action(work):
        header, data = _read_safetensors()
        if mutate is not None:
            mutate(header)
        if data_mutate is not None:
            data = data_mutate(header, data)
        _engine(_model_dir(work, safetensors=_safetensors_bytes(header, data, header_text)))
    return action


def _one_tensor_file(entry_json: str, data: bytes = b"\0" * 16):
    def action(work):
        raw = _safetensors_bytes(None, data, header_text=entry_json)
        _engine(_model_dir(work, safetensors=raw))
    return action


def _set_float(name: str, value: float):
    def data_mutate(header, data):
        begin = header[name]["data_offsets"][0]
        return data[:begin] + struct.pack("<f", value) + data[begin + 4:]
    return data_mutate


def _cli(*argv: str):
    def action(work):
        from beaconkv.cli import main

        err = io.StringIO()
        argv_w = [a.replace("{work}", work) for a in argv]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main(list(argv_w))
            except SystemExit as e:
                status = e.code
        if status not in (0, None):
            raise CliExit(f"exit {status}: {err.getvalue().strip()}")
        return status
    return action


def _split_file(work: str, lines: list) -> str:
    path = os.path.join(work, "bad.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


GOOD = {"prompt": "Ab;Bc;\n", "target": "Ab\nBc\nC?\n", "answer": "0000000000",
        "retrieval": [0]}


def _split(*lines, teacher_forced: bool = False):
    def action(work):
        path = _split_file(work, list(lines))
        argv = ["eval", "--split", path, "--num", "1", "--max-batch", "1"]
        if teacher_forced:
            argv.append("--teacher-forced")
        return _cli(*argv)(work)
    return action


def _bm(*args, **kw):
    import beaconkv

    return beaconkv.BlockManager(*args, **kw)


def _api(fn: Callable[[], object]):
    return lambda work: fn()


def _with_bm(ops: Callable[[object], object], *args, **kw):
    return lambda work: ops(_bm(*(args or (2, 2, 4)), **kw))


def _with_engine(ops: Callable[[object], object], **kw):
    return lambda work: ops(_engine(MODEL, **kw))


def _drop_tensor(name):
    def mutate(h):
        del h[name]
    return mutate


def _set_entry(name, **fields):
    def mutate(h):
        h[name].update(fields)
    return mutate


def _add_entry(name, entry):
    def mutate(h):
        h[name] = entry
    return mutate


EMB = "model.embed_tokens.weight"
NORM = "model.norm.weight"


def _duplicate_header():
    header, _ = _read_safetensors()
    text = json.dumps(header)
    first = json.dumps({NORM: header[NORM]})[1:-1]
    return "{" + first + ", " + text[1:]


# ---------------------------------------------------------------- the corpus

CASES: list[Case] = [
    # ---- model directory: config.json
    Case("config_missing", "ValueError", "config.json",
         lambda w: _engine(_model_dir(w, drop=("config.json",)))),
    Case("config_not_json", "ValueError", "config.json",
         lambda w: _engine(_model_dir(w, config="{not json"))),
    Case("config_is_a_list", "ValueError", "config.json",
         lambda w: _engine(_model_dir(w, config="[1, 2]"))),
    Case("config_vocab_negative", "ValueError", "vocab_size",
         lambda w: _engine(_model_dir(w, config=_config(vocab_size=-73)))),
    Case("config_hidden_is_string", "ValueError", "hidden_size",
         lambda w: _engine(_model_dir(w, config=_config(hidden_size="128")))),
    Case("config_heads_not_divisible", "ValueError", "num_key_value_heads",
         lambda w: _engine(_model_dir(w, config=_config(num_key_value_heads=3)))),
    Case("config_layers_missing", "ValueError", "num_hidden_layers",
         lambda w: _engine(_model_dir(w, config=_config(num_hidden_layers=_DELETE)))),
    Case("config_layers_huge", "ValueError", "num_hidden_layers",
         lambda w: _engine(_model_dir(w, config=_config(num_hidden_layers=2**40)))),
    Case("config_vocab_mismatches_weights", "ValueError", "model.embed_tokens.weight",
         lambda w: _engine(_model_dir(w, config=_config(vocab_size=74)))),
    # ---- model directory: config.json's beaconkv_policy (what the policy "model" runs)
    Case("config_policy_not_a_string", "ValueError", "field 'beaconkv_policy' must be a policy",
         lambda w: _engine(_model_dir(w, config=_config(beaconkv_policy=7)), policy="model")),
    Case("config_policy_unknown_knob", "ValueError", "no knob 'n_becons'",
         lambda w: _engine(_model_dir(w, config=_config(beaconkv_policy="beacon:n_becons=3")),
                           policy="model")),
    Case("config_policy_sets_budget", "ValueError", "it sets 'budget'",
         lambda w: _engine(_model_dir(w, config=_config(beaconkv_policy="beacon:budget=64")),
                           policy="model")),
    Case("config_policy_absent", "ValueError", "names no policy of the model",
         lambda w: _engine(_model_dir(w, config=_config(beaconkv_policy=_DELETE)),
                           policy="model")),
    # ---- model directory: model.safetensors
    Case("safetensors_missing", "ValueError", "model.safetensors",
         lambda w: _engine(_model_dir(w, drop=("model.safetensors",)))),
    Case("safetensors_empty", "ValueError", "shorter than the 8-byte header",
         lambda w: _engine(_model_dir(w, safetensors=b""))),
    Case("safetensors_7_bytes", "ValueError", "shorter than the 8-byte header",
         lambda w: _engine(_model_dir(w, safetensors=b"\1" * 7))),
    Case("safetensors_header_length_huge", "ValueError", "header length",
         lambda w: _engine(_model_dir(w, safetensors=struct.pack("<Q", 2**63) + b"{}"))),
    Case("safetensors_header_not_json", "ValueError", "not valid JSON",
         _one_tensor_file("{\"a\": [")),
    Case("safetensors_header_array", "ValueError", "must be a JSON object",
         _one_tensor_file("[1, 2, 3]")),
    Case("safetensors_dtype_unsupported", "ValueError", "not supported",
         _one_tensor_file('{"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}}')),
    Case("safetensors_shape_negative", "ValueError", "negative",
         _one_tensor_file('{"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}')),
    Case("safetensors_shape_overflow", "ValueError", "int64",
         _one_tensor_file('{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],'
                          '"data_offsets":[0,16]}}')),
    Case("safetensors_offsets_past_end", "ValueError", "runs past the data section",
         _one_tensor_file('{"a":{"dtype":"F32","shape":[400],"data_offsets":[0,1600]}}')),
    Case("safetensors_offsets_reversed", "ValueError", "begin > end",
         _one_tensor_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}')),
    Case("safetensors_offsets_size_mismatch", "ValueError", "spans",
         _one_tensor_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}')),
    Case("safetensors_offsets_not_a_pair", "ValueError", "data_offsets",
         _one_tensor_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}')),
    Case("safetensors_metadata_not_object", "ValueError", "__metadata__",
         _one_tensor_file('{"__metadata__":[1]}')),
    Case("safetensors_duplicate_tensor", "ValueError", "names 'model.norm.weight' twice",
         lambda w: _engine(_model_dir(w, safetensors=_safetensors_bytes(
             None, _read_safetensors()[1], header_text=_duplicate_header())))),
    Case("safetensors_overlapping_tensors", "ValueError", "overlap",
         _load_with_header(_set_entry(NORM, data_offsets=[0, 512]))),
    Case("safetensors_truncated", "ValueError", "truncated",
         lambda w: _engine(_model_dir(w, safetensors=open(
             os.path.join(MODEL, "model.safetensors"), "rb").read()[:-100]))),
    Case("safetensors_tensor_missing", "ValueError", "lm_head.weight",
         _load_with_header(_drop_tensor("lm_head.weight"))),
    Case("safetensors_tensor_wrong_shape", "ValueError", NORM,
         _load_with_header(_set_entry(NORM, shape=[64], data_offsets=[
             _read_safetensors()[0][NORM]["data_offsets"][0],
             _read_safetensors()[0][NORM]["data_offsets"][0] + 256]))),
    Case("safetensors_extra_tensor", "ValueError", "is not used",
         _load_with_header(_add_entry("model.layers.9.mlp.up_proj.weight",
                                      {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}))),
    Case("weights_nan", "ValueError", "non-finite values",
         _load_with_header(data_mutate=_set_float(NORM, float("nan")))),
    Case("weights_inf", "ValueError", "non-finite values",
         _load_with_header(data_mutate=_set_float(EMB, float("-inf")))),
    # ---- model directory: tokenizer.json
    Case("tokenizer_missing", "ValueError", "tokenizer.json",
         lambda w: _engine(_model_dir(w, drop=("tokenizer.json",)))),
    Case("tokenizer_not_json", "ValueError", "tokenizer.json",
         lambda w: _engine(_model_dir(w, tokenizer="{{"))),
    Case("tokenizer_extra_token", "ValueError", "tokenizer.json has 74 tokens",
         lambda w: _engine(_model_dir(w, tokenizer=_tokenizer_vocab(add={"~": 73})))),
    Case("tokenizer_missing_token", "ValueError", "tokenizer.json has 72 tokens",
         lambda w: _engine(_model_dir(w, tokenizer=_tokenizer_vocab(drop="|")))),
    Case("tokenizer_no_eos", "ValueError", "has no \"<eos>\" entry",
         lambda w: _engine(_model_dir(w, tokenizer=_tokenizer_vocab(drop="<eos>", add={"~": 2})))),
    Case("tokenizer_id_out_of_range", "ValueError", "ids must be dense",
         lambda w: _engine(_model_dir(w, tokenizer=_tokenizer_vocab(add={"~": 500})))),
    Case("tokenizer_wrong_format", "ValueError", "model.type",
         lambda w: _engine(_model_dir(w, tokenizer=_tokenizer_model(type="BPE")))),
    # ---- split files (beaconkv eval --split FILE)
    Case("split_line_not_json", "CliExit", "bad.jsonl line 1: not valid JSON",
         _split("{\"prompt\": ")),
    Case("split_line_is_list", "CliExit", "line 1: expected a JSON object", _split([1, 2])),
    Case("split_missing_prompt", "CliExit", "missing field 'prompt'",
         _split({k: v for k, v in GOOD.items() if k != "prompt"})),
    Case("split_missing_target", "CliExit", "missing field 'target'",
         _split({k: v for k, v in GOOD.items() if k != "target"})),
    Case("split_answer_not_string", "CliExit", "field 'answer' must be a str",
         _split({**GOOD, "answer": 1234})),
    Case("split_prompt_empty", "CliExit", "field 'prompt' is empty", _split({**GOOD, "prompt": ""})),
    Case("split_second_line_bad", "CliExit", "line 2: missing field 'answer'",
         _split(GOOD, {"prompt": "Ab;", "target": "x"})),
    Case("split_retrieval_out_of_range", "CliExit", "'retrieval'[0] = 999 is outside",
         _split({**GOOD, "retrieval": [999]})),
    Case("split_retrieval_negative", "CliExit", "'retrieval'[1] = -1 is outside",
         _split({**GOOD, "retrieval": [0, -1]})),
    Case("split_retrieval_not_list", "CliExit", "field 'retrieval' must be a list",
         _split({**GOOD, "retrieval": 3})),
    Case("split_retrieval_string", "CliExit", "'retrieval'[0] must be an integer",
         _split({**GOOD, "retrieval": ["3"]})),
    Case("split_roles_wrong_length", "CliExit", "field 'roles'", _split({**GOOD, "roles": "LL"})),
    Case("split_empty_file", "CliExit", "no problems", _split()),
    Case("split_char_outside_vocab", "CliExit", "not in the vocabulary",
         _split({**GOOD, "prompt": "Ab;\u20ac;\n"})),
    Case("split_target_longer_than_context", "CliExit", "exceeds max_model_len",
         _split({**GOOD, "target": "0" * 2100}, teacher_forced=True)),
    Case("split_no_such_file", "CliExit", "no such file", _cli("eval", "--split", "{work}/none")),
    # ---- CLI arguments
    Case("cli_budget_zero", "CliExit", "argument --budget: 0 is outside",
         _cli("generate", "--prompt", "Ab;", "--budget", "0")),
    Case("cli_budget_negative", "CliExit", "argument --budget",
         _cli("generate", "--prompt", "Ab;", "--budget", "-5")),
    Case("cli_budget_huge", "CliExit", "argument --budget: 99999999999 is outside",
         _cli("generate", "--prompt", "Ab;", "--budget", "99999999999")),
    Case("cli_budget_not_int", "CliExit", "argument --budget: expected an integer",
         _cli("generate", "--prompt", "Ab;", "--budget", "abc")),
    Case("cli_max_new_tokens_zero", "CliExit", "argument --max-new-tokens",
         _cli("generate", "--prompt", "Ab;", "--max-new-tokens", "0")),
    Case("cli_max_new_tokens_huge", "CliExit", "argument --max-new-tokens",
         _cli("generate", "--prompt", "Ab;", "--max-new-tokens", str(2**40))),
    Case("cli_seed_negative", "CliExit", "argument --seed",
         _cli("generate", "--prompt", "Ab;", "--seed", "-1")),
    Case("cli_seed_huge", "CliExit", "argument --seed",
         _cli("generate", "--prompt", "Ab;", "--seed", str(2**70))),
    Case("cli_top_p_zero", "CliExit", "argument --top-p",
         _cli("generate", "--prompt", "Ab;", "--top-p", "0")),
    Case("cli_top_p_above_one", "CliExit", "argument --top-p",
         _cli("generate", "--prompt", "Ab;", "--top-p", "1.5")),
    Case("cli_temperature_nan", "CliExit", "argument --temperature",
         _cli("generate", "--prompt", "Ab;", "--temperature", "nan")),
    Case("cli_temperature_negative", "CliExit", "argument --temperature",
         _cli("generate", "--prompt", "Ab;", "--temperature", "-1")),
    Case("cli_prompt_outside_vocab", "CliExit", "not in the vocabulary",
         _cli("generate", "--prompt", "Ab;\u20ac")),
    Case("cli_eval_num_negative", "CliExit", "argument --num: -199 is outside",
         _cli("eval", "--num", "-199")),
    Case("cli_eval_num_zero", "CliExit", "argument --num", _cli("eval", "--num", "0")),
    Case("cli_eval_model_policy_bad_knob", "CliExit", "no knob 'n_becons'",
         _cli("eval", "--num", "1", "--policy", "model:n_becons=1", "--budget", "96")),
    Case("cli_eval_max_batch_zero", "CliExit", "argument --max-batch",
         _cli("eval", "--max-batch", "0")),
    Case("cli_eval_block_size_zero", "CliExit", "argument --block-size",
         _cli("eval", "--block-size", "0")),
    Case("cli_eval_kv_blocks_negative", "CliExit", "argument --kv-blocks",
         _cli("eval", "--kv-blocks", "-1")),
    Case("cli_eval_max_batch_overflows_pool", "CliExit", "set num_blocks",
         _cli("eval", "--num", "1", "--max-batch", "2000000000")),
    Case("cli_eval_preemption_unknown", "CliExit", "argument --preemption",
         _cli("eval", "--preemption", "sometimes")),
    Case("cli_demo_budget_zero", "CliExit", "argument --budget: 0 is outside",
         _cli("demo", "--budget", "0")),
    Case("cli_demo_num_negative", "CliExit", "argument --num", _cli("demo", "--num", "-3")),
    Case("cli_knob_not_int", "CliExit", "knob 'n_beacons' = 'abc'",
         _cli("generate", "--prompt", "Ab;", "--policy", "beacon", "--knob", "n_beacons=abc")),
    Case("cli_knob_unknown", "CliExit", "has no knob 'nonsense'",
         _cli("generate", "--prompt", "Ab;", "--policy", "beacon", "--knob", "nonsense=1")),
    Case("cli_knob_no_equals", "CliExit", "expected NAME=VALUE",
         _cli("generate", "--prompt", "Ab;", "--knob", "interval")),
    Case("cli_knob_budget_conflict", "CliExit", "disagree",
         _cli("generate", "--prompt", "Ab;", "--policy", "beacon", "--budget", "64", "--knob",
              "budget=32")),
    Case("cli_knob_budget_not_int", "CliExit", "knob 'budget' = 'x': expected int",
         _cli("generate", "--prompt", "Ab;", "--policy", "beacon", "--knob", "budget=x")),
    Case("cli_knob_twice", "CliExit", "given twice",
         _cli("generate", "--prompt", "Ab;", "--knob", "interval=4", "--knob", "interval=5")),
    Case("cli_policy_unknown", "CliExit", "nosuch", _cli("generate", "--prompt", "Ab;",
                                                          "--policy", "nosuch")),
    Case("cli_model_missing", "CliExit", "nowhere",
         _cli("generate", "--prompt", "Ab;", "--model", "{work}/nowhere")),
    Case("cli_analyze_num_negative", "CliExit", "argument --num",
         _cli("analyze", "--out", "{work}/o", "--num", "-1")),
    Case("cli_analyze_threshold_out_of_range", "CliExit", "argument --threshold-frac",
         _cli("analyze", "--out", "{work}/o", "--threshold-frac", "7")),
    # ---- beaconkv bench throughput
    Case("cli_bench_kv_blocks_missing", "CliExit", "--kv-blocks",
         _cli("bench", "throughput", "--num-prompts", "1")),
    Case("cli_bench_kv_blocks_one", "CliExit", "argument --kv-blocks: 1 is outside",
         _cli("bench", "throughput", "--kv-blocks", "1")),
    Case("cli_bench_kv_blocks_too_small", "CliExit", "--kv-blocks 3 is too small",
         _cli("bench", "throughput", "--kv-blocks", "3", "--dataset", "random")),
    Case("cli_bench_num_prompts_zero", "CliExit", "argument --num-prompts",
         _cli("bench", "throughput", "--kv-blocks", "100", "--num-prompts", "0")),
    Case("cli_bench_range_ratio", "CliExit", "argument --random-range-ratio",
         _cli("bench", "throughput", "--kv-blocks", "100", "--random-range-ratio", "1.5")),
    Case("cli_bench_dataset_unknown", "CliExit", "argument --dataset",
         _cli("bench", "throughput", "--kv-blocks", "100", "--dataset", "sharegpt")),
    Case("cli_bench_knob_budget_conflict", "CliExit", "disagree",
         _cli("bench", "throughput", "--kv-blocks", "100", "--policy", "beacon", "--budget",
              "64", "--knob", "budget=32")),
    # ---- Python API: BlockManager
    Case("bm_zero_layers", "ValueError", "num_layers=0", _api(lambda: _bm(0, 2, 4))),
    Case("bm_one_block", "ValueError", "num_blocks=1", _api(lambda: _bm(2, 2, 4, num_blocks=1))),
    Case("bm_host_blocks_one", "ValueError", "num_host_blocks=1",
         _api(lambda: _bm(2, 2, 4, num_host_blocks=1))),
    Case("bm_pool_larger_than_memory", "MemoryError", "GiB",
         _api(lambda: _bm(2, 2, 64, block_size=64, num_blocks=2**31 - 1))),
    Case("bm_prompt_zero", "ValueError", "prompt length 0", _with_bm(lambda b: b.add_sequence(1, 0))),
    Case("bm_keys_wrong_shape", "ValueError", "keys must be a float32 array of shape",
         _with_bm(lambda b: b.add_sequence(1, 3, keys=[[1.0]], values=[[1.0]]))),
    Case("bm_keys_without_values", "ValueError", "values is required",
         _with_bm(lambda b: b.add_sequence(1, 1, keys=[[[[0.0] * 4]] * 2] * 2))),
    Case("bm_unknown_sequence", "ValueError", "unknown sequence id 9",
         _with_bm(lambda b: b.apply_keep_sets(9, {(0, 0): [0]}))),
    Case("bm_keep_slot_out_of_range", "ValueError", "5",
         _with_bm(lambda b: (b.add_sequence(1, 3), b.apply_keep_sets(1, {(0, 0): [0, 5]})))),
    Case("bm_keep_head_out_of_range", "ValueError", "no head (layer 7",
         _with_bm(lambda b: (b.add_sequence(1, 3), b.apply_keep_sets(1, {(7, 0): [0]})))),
    Case("bm_cow_pool_full", "MemoryError", "copy-on-write",
         _with_bm(lambda b: (b.add_sequence(0, 8), b.fork(0, 1), b.add_sequence(2, 8),
                             b.apply_keep_sets(1, {(0, 0): [0, 5]})), 2, 2, 4, block_size=4,
                  num_blocks=17)),
    Case("bm_read_swapped_out", "ValueError", "swapped out",
         _with_bm(lambda b: (b.add_sequence(1, 3), b.swap_out(1), b.read_head(1, 0, 0)), 2, 2, 4,
                  num_host_blocks=64)),
    Case("bm_swap_in_resident", "ValueError", "not swapped out",
         _with_bm(lambda b: (b.add_sequence(1, 3), b.swap_in(1)))),
    Case("bm_fork_onto_existing", "ValueError", "already exists",
         _with_bm(lambda b: (b.add_sequence(1, 3), b.add_sequence(2, 3), b.fork(1, 2)))),
    Case("bm_layer_index_overflow", "TypeError", "incompatible function arguments",
         _with_bm(lambda b: b.retained_tokens(1, 2**40, 0))),
    # ---- Python API: Engine and policies
    Case("engine_max_model_len_negative", "ValueError", "max_model_len=-5",
         _api(lambda: _engine(MODEL, max_model_len=-5))),
    Case("engine_max_model_len_too_long", "ValueError", "max_position_embeddings=2048",
         _api(lambda: _engine(MODEL, max_model_len=100000))),
    Case("engine_num_blocks_negative", "ValueError", "num_blocks=-1",
         _api(lambda: _engine(MODEL, num_blocks=-1))),
    Case("engine_pool_overflow", "ValueError", "needs more than 2147483647 blocks",
         _api(lambda: _engine(MODEL, max_batch=100_000_000))),
    Case("engine_pool_larger_than_memory", "MemoryError", "GiB",
         _api(lambda: _engine(MODEL, max_batch=2_000_000))),
    Case("engine_preemption_unknown", "ValueError", "preemption must be",
         _api(lambda: _engine(MODEL, preemption="sometimes"))),
    Case("engine_max_batch_zero", "ValueError", "max_batch=0",
         _api(lambda: _engine(MODEL, max_batch=0))),
    Case("engine_empty_prompt", "ValueError", "empty prompt",
         _with_engine(lambda e: e.add_request(0, []))),
    Case("engine_token_outside_vocab", "ValueError", "outside the vocabulary",
         _with_engine(lambda e: e.add_request(0, [1, 500]))),
    Case("engine_duplicate_request", "ValueError", "already queued",
         _with_engine(lambda e: (e.add_request(0, [1, 5]), e.add_request(0, [1, 6])))),
    Case("engine_forced_output_too_long", "ValueError", "exceeds max_model_len 64",
         _with_engine(lambda e: e.add_request(0, [1, 5], forced_output=[5] * 63,
                                              max_new_tokens=63), max_model_len=64)),
    Case("engine_top_p_zero", "ValueError", "top_p",
         _with_engine(lambda e: e.add_request(0, [1, 5], temperature=1.0, top_p=0.0))),
    Case("engine_prompt_fills_context", "ValueError", "max_model_len",
         _with_engine(lambda e: e.add_request(0, [1] * 40), max_model_len=32)),
    Case("policy_unknown", "ValueError", "nosuch", _api(lambda: _policy("nosuch"))),
    Case("policy_knob_wrong_type", "ValueError", "knob 'interval'",
         _api(lambda: _policy("beacon", interval="often"))),
    Case("policy_knob_overflow", "ValueError", "knob 'budget'",
         _api(lambda: _policy("snapkv", budget=2**40))),
    Case("policy_knob_invalid_value", "ValueError", "budget",
         _api(lambda: _policy("snapkv", budget=0).validate())),
]


def _policy(name, **knobs):
    import beaconkv

    return beaconkv.policy_config(name, **knobs)


def run_case(case: Case, work: str) -> dict:
    import signal

    os.makedirs(work, exist_ok=True)

    def on_alarm(signum, frame):
        raise TimeoutError(f"case {case.name} ran over {CASE_TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        case.action(work)
        result = {"cls": None, "msg": "no error"}
    except BaseException as e:  # noqa: BLE001 - the class is the result
        result = {"cls": type(e).__name__, "msg": str(e)}
    finally:
        signal.alarm(0)
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    """``python corpus.py START OUT WORKDIR``: run cases START.. and append results to OUT."""
    import resource

    start, out, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    with open(out, "a", encoding="utf-8") as f:
        for i in range(start, len(CASES)):
            f.write(json.dumps({"i": i, "started": True}) + "\n")
            f.flush()
            r = run_case(CASES[i], os.path.join(workdir, CASES[i].name))
            f.write(json.dumps({"i": i, **r}) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
