"""The beaconkv command line: eval's JSON contract, teacher forcing, errors."""

import json
import os
import subprocess
import sys

import pytest

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")
EVAL_KEYS = {"policy", "budget", "num_problems", "accuracy", "mean_generated_tokens",
             "peak_kv_tokens_per_seq", "compression_ratio", "tokens_per_second"}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "beaconkv.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_eval_writes_the_json_contract(tmp_path):
    out = tmp_path / "r.json"
    r = cli("eval", "--model", MODEL, "--split", "dev", "--num", "2", "--policy", "beacon",
            "--budget", "64", "--knob", "interval=16", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert EVAL_KEYS <= data.keys()
    assert data["policy"] == "beacon" and data["budget"] == 64 and data["num_problems"] == 2
    assert 0.0 <= data["accuracy"] <= 1.0
    # Budget 64 + interval 16: after prefill a head never holds more than 80 tokens; the
    # prefilled prompt (+ the first token) is held until the first compression.
    with open(os.path.join(MODEL, "data", "dev.jsonl")) as f:
        prompt_lens = [len(json.loads(line)["prompt"]) + 1 for line in f.readlines()[:2]]
    assert data["peak_kv_tokens_per_seq"] <= max(80, max(prompt_lens) + 1)
    assert data["compression_ratio"] > 1.0
    # Per problem, in the split's order, for `beaconkv compare`.
    with open(os.path.join(MODEL, "data", "dev.jsonl")) as f:
        assert data["problem_ids"] == [json.loads(line)["id"] for line in f.readlines()[:2]]
    assert len(data["correct"]) == 2 and sum(data["correct"]) == round(2 * data["accuracy"])


def test_teacher_forced_full_agrees_with_itself_and_split_may_be_a_file(tmp_path):
    src = os.path.join(MODEL, "data", "dev.jsonl")
    split = tmp_path / "two.jsonl"
    split.write_text("".join(open(src).readlines()[:2]))
    out = tmp_path / "tf.json"
    r = cli("eval", "--model", MODEL, "--split", str(split), "--policy", "full",
            "--teacher-forced", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert EVAL_KEYS <= data.keys()
    assert data["token_agreement"] == 1.0
    assert data["mean_kl"] == pytest.approx(0.0, abs=1e-9)
    assert data["retrieval_accuracy"] == data["full_retrieval_accuracy"]
    assert data["retrieval_agreement"] == 1.0


def test_teacher_forced_eviction_is_measured(tmp_path):
    out = tmp_path / "tf.json"
    r = cli("eval", "--model", MODEL, "--num", "2", "--policy", "streaming", "--budget", "32",
            "--teacher-forced", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["compression_ratio"] > 5
    assert data["token_agreement"] < 1.0 and data["mean_kl"] > 0.0
    assert 0.0 <= data["retrieval_agreement"] < 1.0  # streaming at 32 loses the plan


@pytest.mark.parametrize("args, message", [
    (["eval", "--split", "nope"], "no such file"),
    (["eval", "--policy", "lru"], "lru"),
    (["eval", "--policy", "beacon", "--budget", "8"], "budget"),
    (["generate", "--prompt", "\u00e9"], "\u00e9"),
])
def test_errors_are_one_line_without_traceback(args, message):
    r = cli(*args[:1], "--model", MODEL, *args[1:])
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert message in r.stderr


def test_eval_records_each_problem_under_its_own_id(tmp_path):
    # A long problem, two short ones, a long one, two at a time: the second finishes first.
    # The second and fourth carry a wrong reference answer, so the full cache gets exactly
    # the first and third right, and each entry must sit beside its own problem's id.
    from beaconkv.evaluate import evaluate

    with open(os.path.join(MODEL, "data", "dev.jsonl")) as f:
        problems = sorted((json.loads(line) for line in f.readlines()[:12]),
                          key=lambda p: -len(p["target"]))
    chosen = [problems[0], problems[-1], problems[-2], problems[1]]
    for i in (1, 3):
        chosen[i] = dict(chosen[i], answer="0")
    split = tmp_path / "mixed.jsonl"
    split.write_text("".join(json.dumps(p) + "\n" for p in chosen))
    order = []
    r = evaluate(MODEL, str(split), "full", None, max_batch=2,
                 on_output=lambda p, o: order.append(o["id"]))
    assert order[0] == 1  # out of the split's order
    assert r.problem_ids == [p["id"] for p in chosen]
    assert r.correct == [True, False, True, False]


def write_run(path, correct, ids=None):
    path.write_text(json.dumps({"problem_ids": ids or [str(i) for i in range(len(correct))],
                                "correct": correct, "accuracy": sum(correct) / len(correct)}))
    return str(path)


def test_compare_reports_a_paired_difference(tmp_path):
    # 10 problems: a gets 8, b gets 6; b loses problems 0, 1, 2 and gains 9. The difference's
    # interval: -0.2 +- 1.96 sqrt(4 - 4 / 10) / 10; McNemar: 2 (1 + 4) / 2^4.
    a = write_run(tmp_path / "a.json", [True] * 8 + [False] * 2)
    b = write_run(tmp_path / "b.json", [False] * 3 + [True] * 5 + [False, True])
    r = cli("compare", a, b)
    assert r.returncode == 0, r.stderr
    assert "n=10 a=0.8000 [0.490, 0.943] b=0.6000 [0.313, 0.832]" in r.stdout
    assert "b-a=-20.00 pt [-57.19, +17.19] lost=3 gained=1 mcnemar_p=0.62" in r.stdout
    # Two pairs (two splits): a line each and the pooled line.
    c = write_run(tmp_path / "c.json", [True] * 4, ids=list("wxyz"))
    d = write_run(tmp_path / "d.json", [True, True, False, False], ids=list("wxyz"))
    r = cli("compare", a, b, c, d)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and lines[2].startswith("all: n=14 a=0.8571")
    assert "lost=5 gained=1" in lines[2]


@pytest.mark.parametrize("case, message", [
    ("odd", "runs come in pairs"),
    ("other problems", "are not runs of the same problems"),
    ("no per-problem results", "no per-problem results"),
    ("not an object", "no per-problem results"),
    ("teacher forced", "no per-problem results"),
    ("lengths", "2 problem_ids but 1 correct entries"),
    ("not a bool", "correct[1] = 1 is not true or false"),
    ("empty", "a run of no problems"),
    ("not json", "not valid JSON"),
    ("missing", "No such file"),
])
def test_compare_errors_name_the_problem(tmp_path, case, message):
    a = write_run(tmp_path / "a.json", [True, False])
    other = {
        "odd": None,
        "other problems": write_run(tmp_path / "b.json", [True, True], ids=["0", "7"]),
        "no per-problem results": str(tmp_path / "old.json"),
        "not an object": str(tmp_path / "list.json"),
        "teacher forced": str(tmp_path / "tf.json"),
        "lengths": str(tmp_path / "lengths.json"),
        "not a bool": str(tmp_path / "int.json"),
        "empty": str(tmp_path / "empty.json"),
        "not json": str(tmp_path / "bad.json"),
        "missing": str(tmp_path / "nope.json"),
    }[case]
    (tmp_path / "old.json").write_text(json.dumps({"accuracy": 0.5}))
    (tmp_path / "list.json").write_text(json.dumps([True, False]))
    (tmp_path / "tf.json").write_text(json.dumps({"accuracy": 0.5, "token_agreement": 0.9}))
    (tmp_path / "lengths.json").write_text(json.dumps({"problem_ids": ["0", "1"],
                                                       "correct": [True]}))
    (tmp_path / "int.json").write_text(json.dumps({"problem_ids": ["0", "1"],
                                                   "correct": [True, 1]}))
    (tmp_path / "empty.json").write_text(json.dumps({"problem_ids": [], "correct": []}))
    (tmp_path / "bad.json").write_text("{")
    r = cli("compare", a, *([other] if other else []))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert message in r.stderr


def test_eval_counts_requests_that_ran_out_of_memory(tmp_path):
    out = tmp_path / "r.json"
    r = cli("eval", "--model", MODEL, "--num", "2", "--kv-blocks", "50", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "out_of_memory=2" in r.stdout
    assert "2 of 2 requests ran out of KV memory" in r.stderr
    assert json.loads(out.read_text())["out_of_memory"] == 2
    forced = cli("eval", "--model", MODEL, "--num", "1", "--kv-blocks", "50", "--teacher-forced")
    assert forced.returncode == 1 and "ran out of KV memory" in forced.stderr


def test_evaluate_refuses_a_non_positive_problem_count():
    from beaconkv.evaluate import load_problems

    with pytest.raises(ValueError, match="num must be >= 1"):
        load_problems(MODEL, "dev", num=-5)


def test_held_out_splits_load_by_name_and_are_new_problems():
    from beaconkv.evaluate import load_problems

    seen = {p["prompt"] for split in ("dev", "test") for p in load_problems(MODEL, split)}
    for seed in (31337, 47711, 90210, 70123, 80917):
        held = load_problems(MODEL, f"heldout-{seed}")
        assert len(held) == 200 and all(p["id"].startswith(f"{seed}-") for p in held)
        prompts = {p["prompt"] for p in held}
        assert not seen & prompts  # nor a problem of an earlier split
        seen |= prompts
    with pytest.raises(ValueError, match="no such file"):
        load_problems(MODEL, "heldout-1")


def test_defuse_held_out_splits_are_new_problems():
    from beaconkv.evaluate import load_problems

    for prefix, seeds in (("defuse", (52361, 60017, 71993)),
                          ("defuse12", (83117, 90533, 97241))):
        seen = {p["prompt"] for p in load_problems(MODEL, f"{prefix}-dev")}
        for seed in seeds:
            held = load_problems(MODEL, f"{prefix}-heldout-{seed}")
            assert len(held) == 200 and all(p["id"].startswith(f"{seed}-") for p in held)
            assert not seen & {p["prompt"] for p in held}


def test_python_dash_m_beaconkv_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "beaconkv", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for sub in ("generate", "eval", "compare", "demo", "analyze", "bench"):
        assert sub in r.stdout


def test_every_option_has_help_and_the_docstring_names_every_subcommand():
    import argparse

    import beaconkv
    from beaconkv import cli

    def parsers(p, path):
        yield path, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from parsers(sub, path + [name])

    found = []
    for path, p in parsers(cli.build_parser(), ["beaconkv"]):
        found.append(path)
        for action in p._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert action.help, f"{' '.join(path)} {action.option_strings[0]} has no help"
    leaves = {" ".join(p[1:]) for p in found if len(p) > 1} - {"bench"}
    assert leaves == {"generate", "eval", "compare", "demo", "analyze", "bench throughput"}
    for leaf in leaves:
        assert leaf in cli.__doc__
    # --policy lists the core's policy names.
    assert all(name in cli.build_parser()._subparsers._group_actions[0].choices["eval"]
               .format_help().replace("\n", " ").replace("  ", " ")
               for name in beaconkv.policy_names())


def test_eval_with_the_paged_scorer_agrees_with_the_host_scorer(tmp_path):
    results = {}
    for scorer in ("host", "paged"):
        out = tmp_path / f"{scorer}.json"
        r = cli("eval", "--model", MODEL, "--split", "dev", "--num", "2", "--policy", "beacon",
                "--budget", "64", "--knob", "interval=16", "--scorer", scorer,
                "--json", str(out))
        assert r.returncode == 0, r.stderr
        results[scorer] = json.loads(out.read_text())
    for key in ("accuracy", "mean_generated_tokens", "peak_kv_tokens_per_seq"):
        assert results["paged"][key] == results["host"][key], key
    r = cli("eval", "--model", MODEL, "--split", "dev", "--num", "1", "--teacher-forced",
            "--scorer", "paged")
    assert r.returncode != 0 and "host scorer only" in r.stderr


def test_eval_runs_the_models_own_policy_and_names_it(tmp_path):
    """--policy model: the setting the model ships (config.json's beaconkv_policy), with the
    knobs given on top; the line names the setting and the JSON has every knob that ran."""
    import beaconkv

    spec = beaconkv.model_policy_spec(MODEL)
    out = tmp_path / "r.json"
    r = cli("eval", "--model", MODEL, "--split", "dev", "--num", "2", "--policy", "model",
            "--budget", "96", "--knob", "interval=16", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert f"model_policy={spec}" in r.stdout
    data = json.loads(out.read_text())
    assert data["policy"] == "model" and data["budget"] == 96
    expected = beaconkv.make_policy_config(spec, 96, knobs=["interval=16"])
    assert data["policy_config"]["budget_mode"] == expected.budget_mode == "pooled"
    assert data["policy_config"]["blur_layers"] == expected.blur_layers
    assert data["policy_config"]["interval"] == 16


def test_demo_shows_the_models_own_setting_beside_the_defaults():
    import io

    import beaconkv
    from beaconkv.demo import run_demo

    out = io.StringIO()
    rows = run_demo(MODEL, num=2, out=out)
    assert [r["policy"] for r in rows] == ["full", "beacon", beaconkv.MODEL_POLICY, "snapkv"]
    model_row = rows[2]
    assert model_row["policy_config"]["budget_mode"] == "pooled"
    assert model_row["budget"] == rows[1]["budget"] == 128
    assert beaconkv.model_policy_spec(MODEL) in out.getvalue()
