"""tools/calibrate_blur_layers.py: the ranking rule by hand, and one run on three problems."""

import json
import os

import pytest

from conftest import load_tool  # tests/python/conftest.py

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")


needs_model = pytest.mark.skipif(not os.path.isfile(os.path.join(MODEL, "config.json")),
                                 reason="tiny-reasoner checkpoint not present")


def test_ranking_keeps_what_beats_no_blur_best_first():
    tool = load_tool("calibrate_blur_layers")
    # The base model's tuning split at 96 / 32 (tuning_evals.txt): only layer 3 and every
    # layer beat the 0.938 without blurred rows.
    tight = {"every": 0.955, "0": 0.931, "1": 0.938, "2": 0.934, "3": 0.962}
    assert tool.ranked(tight, 0.938, 4) == ["3", "every"]
    # Ties: fewer layers first, then the lower layer.
    assert tool.ranked({"every": 0.865, "3": 0.865, "2": 0.865, "1": 0.5}, 0.788, 4) == [
        "2", "3", "every"]
    assert tool.ranked({"every": 0.9, "0": 0.8}, 0.95, 2) == []
    assert tool.settings(3) == ["every", "0", "1", "2"]
    assert tool.knobs_of("every", {"interval": "32"}, 0.02) == {"interval": "32",
                                                                "blur_speed": "0.02"}
    assert tool.settings(1) == ["every"]  # one layer: "every" and "0" are the same setting
    assert tool.knobs_of("2", {}, 0.05) == {"blur_speed": "0.05", "blur_layers": "2"}


def test_the_guard_takes_the_first_setting_that_holds():
    tool = load_tool("calibrate_blur_layers")
    order = ["3", "every", "1"]
    # At the guard budget without blurred rows 0.993: layer 3 loses 0.3 point, every layer
    # exactly the tolerance (which holds), layer 1 nothing.
    assert tool.choose(order, {"3": 0.990, "every": 0.991, "1": 0.993}, 0.993, 0.002) == "every"
    assert tool.choose(order, {"3": 0.990, "every": 0.990, "1": 0.9905}, 0.993, 0.002) is None
    assert tool.choose(order, {"3": 0.993}, 0.993, 0.0) == "3"  # stops at the first
    assert tool.choose([], {}, 0.5, 0.002) is None
    assert tool.holds(0.991, 0.993, 0.002) and not tool.holds(0.9909, 0.993, 0.002)


@needs_model
def test_a_run_on_three_dev_problems(tmp_path):
    from beaconkv.evaluate import evaluate
    from beaconkv.task import read_split

    tool = load_tool("calibrate_blur_layers")
    # Three dev problems beacon answers wrong at 96 / 32 with the defaults (2026-12-05).
    ids = {"1001-108", "1001-11", "1001-128"}
    problems = [p for p in read_split(os.path.join(MODEL, "data", "dev.jsonl")) if p["id"] in ids]
    assert len(problems) == 3
    split = tmp_path / "three.jsonl"
    split.write_text("".join(json.dumps(p) + "\n" for p in problems))
    out = tmp_path / "out.json"
    assert tool.main(["--model", MODEL, "--split", f"{split}@32", "--budget", "96",
                      "--guard-budget", "158", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [s["layers"] for s in report["settings"]] == ["every", "0", "1", "2", "3"]
    tight = {s["layers"]: s["mean_accuracy"] for s in report["settings"]}
    off = report["off"]["mean_accuracy"]
    assert report["ranking"] == tool.ranked(tight, off, 4)
    # The tool runs the knobs it reports: layer 3's accuracy is that of a direct run.
    want = evaluate(MODEL, str(split), "beacon", 96, interval=32,
                    policy_knobs={"blur_speed": "0.02", "blur_layers": "3"}).accuracy
    assert tight["3"] == want
    # The choice is the first of the ranking that holds at 158; every one before it loses.
    choice, order = report["choice"], report["ranking"]
    guard = report.get("guard", {"off": 0.0, "settings": {}})
    passes = [s for s in order
              if s in guard["settings"] and guard["settings"][s] >= guard["off"] - 0.002]
    assert choice == (passes[0] if passes else None)
    if choice is not None:
        assert tight[choice] > off
        assert all(guard["settings"][s] < guard["off"] - 0.002 for s in order[:order.index(choice)])
        assert len(guard["settings"]) == order.index(choice) + 1  # it stops at the choice


def test_bad_arguments_exit_with_the_reason(capsys):
    tool = load_tool("calibrate_blur_layers")
    dev = ["--split", "dev", "--budget", "96"]
    for extra, reason in ((["--knob", "blur_layers=3"], "--knob blur_layers: the tool sets it"),
                          (["--knob", "blur_speed=0.1"], "--knob blur_speed: the tool sets it"),
                          (["--knob", "interval"], "--knob takes K=V"),
                          (["--blur-speed", "0"], "--blur-speed must be > 0"),
                          (["--tolerance", "-0.01"], "--tolerance must be >= 0"),
                          (["--guard-budget", "96"], "must be above --budget"),
                          (["--num", "0"], "--num must be >= 1"),
                          (["--model", "/nonexistent"], "config.json")):
        with pytest.raises(SystemExit):
            tool.main(dev + extra)
        assert reason in capsys.readouterr().err, extra
