"""The two-task checkpoint (models/tiny-reasoner-2task): what it claims to be, and that the
engine's full cache solves both tasks with it (docs/testbed.md, "The two-task model")."""

import json
import os

from beaconkv.evaluate import evaluate
from beaconkv.task import DEFUSE_VERSION, TASK_VERSION

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner-2task")
BASE = os.path.join(ROOT, "models", "tiny-reasoner")


def test_checkpoint_names_both_tasks_and_keeps_the_base_layout():
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    base = json.load(open(os.path.join(BASE, "config.json")))
    assert cfg["beaconkv_task_version"].split(",") == [TASK_VERSION, DEFUSE_VERSION]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rope_theta"):
        assert cfg[key] == base[key], key
    assert os.path.getsize(os.path.join(MODEL, "model.safetensors")) <= 20 * 2**20
    # One tokenizer: the same file as the base model's.
    assert open(os.path.join(MODEL, "tokenizer.json")).read() == \
        open(os.path.join(BASE, "tokenizer.json")).read()
    # The splits are the base model's (data/ is a link to them).
    assert os.path.samefile(os.path.join(MODEL, "data", "dev.jsonl"),
                            os.path.join(BASE, "data", "dev.jsonl"))


def test_full_cache_solves_both_tasks():
    # Whole splits (docs/testbed.md): 196/200 of defuse12-dev, 200/200 of dev; here a prefix
    # of each (one of the first 24 def-use problems is among the 4 it misses).
    for split, num, least in (("defuse12-dev", 24, 22), ("dev", 3, 3)):
        r = evaluate(MODEL, split, "full", num=num, max_batch=8)
        assert r.num_problems == num
        assert r.accuracy * num >= least - 1e-9, (split, r.accuracy)


def test_the_plan_exec_only_model_does_not_solve_def_use():
    # What the fine-tune added: the base checkpoint answers none of these.
    r = evaluate(BASE, "defuse12-dev", "full", num=4, max_batch=8)
    assert r.accuracy == 0.0
