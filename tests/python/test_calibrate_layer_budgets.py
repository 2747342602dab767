"""tools/calibrate_layer_budgets.py: the offset rules by hand, and one run on three problems."""

import json
import os

import pytest

from conftest import load_tool  # tests/python/conftest.py

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")


def write_dev_problems(path, ids):
    """The dev problems with these ids, as a split file at `path`."""
    from beaconkv.task import read_split

    problems = [p for p in read_split(os.path.join(MODEL, "data", "dev.jsonl")) if p["id"] in ids]
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path


needs_model = pytest.mark.skipif(not os.path.isfile(os.path.join(MODEL, "config.json")),
                                 reason="tiny-reasoner checkpoint not present")


def test_pair_moves_from_the_least_to_the_most_needy_layer():
    tool = load_tool("calibrate_layer_budgets")
    assert tool.pair_offsets([11, 7, 24, 31], 16) == [0, -16, 0, 16]
    assert tool.pair_offsets([3, 1, 1, 3], 8) == [8, -8, 0, 0]  # ties go to the earlier layer
    assert tool.pair_offsets([5, 5, 5], 8) == [0, 0, 0]


def test_proportional_offsets_hand_worked():
    tool = load_tool("calibrate_layer_budgets")
    # Mean 18.25; distances -7.25 / -11.25 / 5.75 / 12.75, scaled so the largest is 16:
    # -9.1 / -14.1 / 7.2 / 16, in eights.
    assert tool.proportional_offsets([11, 7, 24, 31], 16, 8) == [-8, -16, 8, 16]
    assert tool.proportional_offsets([12, 1, 54, 39], 16, 8) == [-8, -16, 16, 8]
    # Exact -2.7 / -2.7 / -2.7 / 8 round to 0 / 0 / 0 / 8; the sum is brought back to 0 by the
    # entry rounded furthest up from its value (the first of the tied ones).
    assert tool.proportional_offsets([0, 0, 0, 3], 8, 8) == [-8, 0, 0, 8]
    assert tool.proportional_offsets([4, 4, 4, 4], 16, 8) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="multiple of the quantum"):
        tool.proportional_offsets([1, 2], 12, 8)


def test_candidates_sum_to_zero_without_repeats():
    tool = load_tool("calibrate_layer_budgets")
    cands = tool.candidates([11, 7, 24, 31], [8, 16, 24], 8)
    assert [0, -16, 0, 16] in cands and [-8, -16, 8, 16] in cands
    assert len(cands) == len({tuple(c) for c in cands})
    for c in cands:
        assert sum(c) == 0 and all(o % 8 == 0 for o in c) and any(c)
    assert tool.candidates([2, 2, 2, 2], [8, 16], 8) == []


def test_split_specs():
    tool = load_tool("calibrate_layer_budgets")
    assert tool.parse_split("dev@16", 32) == ("dev", 16)
    assert tool.parse_split("dev", 32) == ("dev", 32)
    assert tool.parse_split("/tmp/a@b/dev.jsonl", 32) == ("/tmp/a@b/dev.jsonl", 32)
    for bad in ("dev@0", "@16"):
        with pytest.raises(ValueError, match="interval >= 1"):
            tool.parse_split(bad, 32)


@needs_model
def test_a_run_on_three_dev_problems(tmp_path):
    tool = load_tool("calibrate_layer_budgets")
    # Three dev problems beacon answers wrong at 96 / 32 with the defaults (2026-12-05), so
    # the oracle has failures to replay.
    split = write_dev_problems(tmp_path / "three.jsonl", {"1001-108", "1001-11", "1001-128"})
    out = tmp_path / "out.json"
    # Step 48 takes a layer below n_recent + n_sinks (52): those candidates are skipped.
    assert tool.main(["--model", MODEL, "--split", f"{split}@32", "--budget", "96",
                      "--steps", "16,48", "--oracle-sample", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (entry,) = report["splits"]
    assert entry["problems"] == 3 and entry["interval"] == 32
    assert entry["failures"] == round(3 * (1 - entry["uniform_accuracy"])) > 0
    assert entry["accuracy"] == entry["uniform_accuracy"]  # --eval-policy beacon
    assert len(entry["repairs_per_layer"]) == 4
    assert all(0 <= r <= entry["oracle_sample"] for r in entry["repairs_per_layer"])
    assert report["candidates"], "no candidate ran"
    for c in report["candidates"]:
        assert sum(c["offsets"]) == 0 and max(abs(o) for o in c["offsets"]) <= 16
    best = report["choice"]
    assert best["mean_accuracy"] >= entry["accuracy"]
    if best["offsets"] is not None:
        assert any(c["offsets"] == best["offsets"] and c["mean_accuracy"] == best["mean_accuracy"]
                   for c in report["candidates"])
    with pytest.raises(SystemExit):
        tool.main(["--split", "dev", "--budget", "96", "--knob", "layer_budget_offsets=0/0/0/0"])
    with pytest.raises(SystemExit):
        tool.main(["--split", "dev", "--budget", "96", "--eval-policy", "h2o"])


@needs_model
def test_pooled_candidates_are_judged_pooled(tmp_path):
    from beaconkv.evaluate import evaluate

    tool = load_tool("calibrate_layer_budgets")
    split = write_dev_problems(tmp_path / "one.jsonl", {"1001-108"})
    out = tmp_path / "out.json"
    assert tool.main(["--model", MODEL, "--split", f"{split}@32", "--budget", "96",
                      "--steps", "16", "--oracle-sample", "1", "--eval-policy", "beacon-pooled",
                      "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["eval_policy"] == "beacon-pooled"
    (entry,) = report["splits"]
    pooled = evaluate(MODEL, str(split), "beacon-pooled", 96, interval=32).accuracy
    assert entry["accuracy"] == pooled and entry["uniform_accuracy"] == 0.0
    assert report["candidates"], "no candidate ran"
    for c in report["candidates"]:
        want = evaluate(MODEL, str(split), "beacon-pooled", 96, interval=32,
                        policy_knobs={"layer_budget_offsets": tool.knob_text(c["offsets"])}
                        ).accuracy
        assert c["accuracy"] == [want]
