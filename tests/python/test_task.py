"""The plan-and-execute generator: determinism, exact arithmetic, role marks, splits."""

import json
import pathlib
import random

import pytest

import beaconkv.task as task
from beaconkv.tokenizer import CharTokenizer

DATA = pathlib.Path(__file__).resolve().parents[2] / "models" / "tiny-reasoner" / "data"


def _example(seed=0, **kw):
    return task.generate(random.Random(seed), task.Difficulty(**kw))


def test_worked_example_is_exact():
    # Chain: +120, -7737, +12 on a 6-digit register with 4-digit operands; prompt shuffled.
    ops = [("+", 120), ("-", 7737), ("+", 12)]
    ex = task.build_example(ops, order=[2, 0, 1], width=6, operand_digits=4)
    assert ex.prompt == "C+2100;A+0210;B-7377;\n"
    assert ex.target.split("\n")[:4] == ["A+0210", "B-7377", "C+2100", "D?"]
    # 120 - 7737 = -7617 = 992383 (mod 10**6), then + 12 = 992395.
    assert ex.answer == task.digits_lsb(992395, 6) == "593299"
    block_b = ex.target.split("\n")[8:12]
    assert block_b == ["B-737700", "|021000", "-011111", "=383299"]
    assert ex.roles[ex.target.index("B-737700"):][:9] == "LRRRRRZZF"
    assert ex.target.endswith("D?\n#593299")
    assert task.extract_answer(ex.target) == ex.answer


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize("width", [1, 3, 10])
def test_answer_matches_independent_solver(seed, width):
    ex = _example(seed, min_steps=1, max_steps=9, width=width, operand_digits=width)
    assert task.reference_answer(ex.prompt, width) == ex.answer
    assert task.extract_answer(ex.target) == ex.answer


def test_every_row_of_every_step_is_consistent():
    ex = _example(5, min_steps=12, max_steps=12)
    lines = ex.target.split("\n")
    n = ex.n_steps
    plan = {ln[0]: ln[1:] for ln in lines[:n]}
    register = "0" * 10
    for k in range(n):
        head, xrow, crow, rrow = lines[n + 1 + 4 * k: n + 5 + 4 * k]
        label, op, y = head[0], head[1], head[2:]
        assert head[1:5] == plan[label]  # the header re-reads its plan line verbatim
        assert head[5:] == "0" * 7  # and pads the 3-digit operand to the register width
        assert xrow == "|" + register
        assert crow[0] == op and crow[1] == "0"
        x, yv = task.value_lsb(register), task.value_lsb(y)
        expect = (x + yv if op == "+" else x - yv) % 10 ** 10
        assert rrow == "=" + task.digits_lsb(expect, 10)
        register = rrow[1:]


def test_roles_mark_exactly_the_far_back_copies():
    ex = _example(3, min_steps=6, max_steps=6)
    assert len(ex.roles) == len(ex.target)
    assert set(ex.roles) <= set(task.ROLES)
    lines = ex.target.split("\n")
    plan_len = sum(len(ln) + 1 for ln in lines[: ex.n_steps + 1])
    retrieved = "".join(ex.target[i] for i in ex.retrieval_positions())
    # The retrieval tokens are exactly the plan lines minus their labels, in step order.
    expect = "".join(ln[1:] for ln in lines[: ex.n_steps + 1])
    assert retrieved == expect
    assert all(i >= plan_len for i in ex.retrieval_positions())
    # Each retrieved token equals the plan token with the same label and offset.
    for i in ex.retrieval_positions():
        line_start = ex.target.rfind("\n", 0, i) + 1
        label, offset = ex.target[line_start], i - line_start
        src = ex.target.index(label)  # first occurrence: the plan line
        assert ex.target[src + offset] == ex.target[i]


def test_labels_are_unique_keys():
    ex = _example(11, min_steps=task.MAX_STEPS, max_steps=task.MAX_STEPS)
    plan = ex.target[: ex.target.index("?") + 1]
    for ch in task.LABELS_UPPER[: ex.n_steps]:
        assert ex.prompt.count(ch) == 1 and plan.count(ch) == 1
        # the prompt item and the plan line carry the same operation after the label
        item = ex.prompt[ex.prompt.index(ch):].split(";")[0]
        assert plan[plan.index(ch):].split("\n")[0] == item
    assert plan.count(task.LABELS_UPPER[ex.n_steps]) == 1


def test_version_2_prompts_use_lowercase_labels():
    a = task.generate(random.Random(4), task.Difficulty(min_steps=3, max_steps=3))
    b = task.generate(random.Random(4), task.Difficulty(min_steps=3, max_steps=3),
                      prompt_case="lower")
    assert b.prompt == a.prompt.translate(str.maketrans("ABC", "abc"))
    assert b.target == a.target


def test_generation_is_deterministic_and_seed_dependent():
    d = task.Difficulty(min_steps=2, max_steps=5)
    a = [e.target for e in task.split_examples(9, 5, d)]
    b = [e.target for e in task.split_examples(9, 5, d)]
    c = [e.target for e in task.split_examples(10, 5, d)]
    assert a == b
    assert a != c


def test_default_difficulty_gives_long_traces():
    lens = [len(e.target) + 1 for e in task.split_examples(4, 40, task.Difficulty())]
    assert sum(lens) / len(lens) >= 1000


@pytest.mark.parametrize("bad", [
    dict(min_steps=0), dict(min_steps=5, max_steps=4), dict(max_steps=task.MAX_STEPS + 1),
    dict(width=0), dict(operand_digits=11), dict(operand_digits=0), dict(ops="*"),
])
def test_difficulty_validation(bad):
    with pytest.raises(ValueError):
        task.Difficulty(**bad).validate()


def test_alphabet_covers_everything_and_tokenizes():
    tok = CharTokenizer.from_chars(task.ALPHABET)
    ex = _example(2, min_steps=task.MAX_STEPS, max_steps=task.MAX_STEPS)
    text = ex.prompt + ex.target
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(ex.target)) == len(ex.target)  # one token per role mark


def test_split_file_round_trip(tmp_path):
    out = tmp_path / "s.jsonl"
    assert task.main(["--out", str(out), "--seed", "3", "--count", "4",
                      "--min-steps", "2", "--max-steps", "3"]) == 0
    recs = task.read_split(str(out))
    assert len(recs) == 4
    for rec, ex in zip(recs, task.split_examples(3, 4, task.Difficulty(2, 3))):
        assert rec["prompt"] == ex.prompt and rec["target"] == ex.target
        assert rec["answer"] == ex.answer and rec["roles"] == ex.roles
        assert rec["retrieval"] == ex.retrieval_positions()
        assert rec["task_version"] == task.TASK_VERSION


@pytest.mark.parametrize("name", ["dev", "test"])
def test_committed_splits_are_reproducible(name):
    recs = task.read_split(str(DATA / f"{name}.jsonl"))
    assert len(recs) >= 200
    diff = task.Difficulty(**recs[0]["difficulty"])
    seed = int(recs[0]["id"].split("-")[0])
    regen = task.split_examples(seed, len(recs), diff)
    for rec, ex in zip(recs, regen):
        assert rec["target"] == ex.target and rec["roles"] == ex.roles
    assert sum(len(r["target"]) + 1 for r in recs) / len(recs) >= 1000
    assert json.loads(json.dumps(recs[0])) == recs[0]


def test_first_label_shifts_every_label_and_keeps_the_work():
    rng_a, rng_b = random.Random(8), random.Random(8)
    d = task.Difficulty(min_steps=3, max_steps=3)
    base, shifted = task.generate(rng_a, d), task.generate(rng_b, d, first_label=20)
    assert shifted.target.split("\n")[:4] == [
        "U" + base.target.split("\n")[0][1:], "V" + base.target.split("\n")[1][1:],
        "W" + base.target.split("\n")[2][1:], "X?"]
    assert shifted.answer == base.answer and shifted.roles == base.roles
    with pytest.raises(ValueError):
        task.generate(random.Random(8), d, first_label=task.MAX_STEPS - 2)
