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
    # Chain: +2, -7, +9 on a 4-digit register; prompt shuffled.
    ops = [("+", 2), ("-", 7), ("+", 9)]
    ex = task.build_example(ops, order=[2, 0, 1], width=4)
    assert ex.prompt == "Cj;Ac;Br;\n"
    assert ex.target.split("\n")[:4] == ["Ac", "Br", "Cj", "D?"]
    # 2 - 7 = -5 = 9995 (mod 10**4), then + 9 = 10004 = 0004.
    assert ex.answer == task.digits_lsb(4, 4) == "4000"
    block_b = ex.target.split("\n")[9:14]
    assert block_b == ["Br", "-7000", "|2000", "-0111", "=5999"]
    start = ex.target.index("Br\n-")
    assert ex.roles[start:start + 10] == "LRFOOOOOFF"
    assert ex.target.endswith("D?\n#4000")
    assert task.extract_answer(ex.target) == ex.answer


def test_codes_round_trip_and_are_single_characters():
    for op in "+-":
        for digit in range(10):
            code = task.encode_op(op, digit)
            assert len(code) == 1 and code in task.ALPHABET
            assert task.decode_op(code) == (op, digit)
    with pytest.raises(ValueError, match="not an operation code"):
        task.decode_op("z")


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize("width", [1, 3, 10])
def test_answer_matches_independent_solver(seed, width):
    ex = _example(seed, min_steps=1, max_steps=9, width=width)
    assert task.reference_answer(ex.prompt, width) == ex.answer
    assert task.extract_answer(ex.target) == ex.answer


def test_every_row_of_every_step_is_consistent():
    ex = _example(5, min_steps=12, max_steps=12)
    lines = ex.target.split("\n")
    n = ex.n_steps
    plan = {ln[0]: ln[1:] for ln in lines[:n]}
    register = "0" * 10
    for k in range(n):
        head, orow, xrow, crow, rrow = lines[n + 1 + 5 * k: n + 6 + 5 * k]
        assert len(head) == 2 and head[1] == plan[head[0]]  # re-reads its plan line verbatim
        op, digit = task.decode_op(head[1])
        assert orow == op + str(digit) + "0" * 9  # the operand the code stands for, padded
        assert xrow == "|" + register
        assert crow[0] == op and crow[1] == "0"
        x = task.value_lsb(register)
        expect = (x + digit if op == "+" else x - digit) % 10 ** 10
        assert rrow == "=" + task.digits_lsb(expect, 10)
        register = rrow[1:]
    assert lines[n + 1 + 5 * n:] == [task.LABELS_UPPER[n] + "?", "#" + register]


def test_roles_mark_exactly_the_far_back_copies():
    ex = _example(3, min_steps=6, max_steps=6)
    assert len(ex.roles) == len(ex.target)
    assert set(ex.roles) <= set(task.ROLES)
    lines = ex.target.split("\n")
    plan_len = sum(len(ln) + 1 for ln in lines[: ex.n_steps + 1])
    retrieved = "".join(ex.target[i] for i in ex.retrieval_positions())
    # The retrieval tokens are exactly the plan lines' codes (and the final "?"), in step order.
    assert retrieved == "".join(ln[1:] for ln in lines[: ex.n_steps + 1])
    assert all(i >= plan_len for i in ex.retrieval_positions())
    # Each is ONE token right after its label, equal to the token after the same label in the
    # plan and in the prompt.
    for i in ex.retrieval_positions():
        label = ex.target[i - 1]
        assert ex.roles[i - 1] == "L"
        assert ex.target[ex.target.index(label) + 1] == ex.target[i]
        if label in ex.prompt:
            assert ex.prompt[ex.prompt.index(label) + 1] == ex.target[i]


def test_labels_are_unique_keys():
    ex = _example(11, min_steps=task.MAX_STEPS, max_steps=task.MAX_STEPS)
    plan = ex.target[: ex.target.index("?") + 1]
    for ch in task.LABELS_UPPER[: ex.n_steps]:
        assert ex.prompt.count(ch) == 1 and plan.count(ch) == 1
        # the prompt item and the plan line carry the same operation after the label
        item = ex.prompt[ex.prompt.index(ch):].split(";")[0]
        assert plan[plan.index(ch):].split("\n")[0] == item
    assert plan.count(task.LABELS_UPPER[ex.n_steps]) == 1


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
    dict(width=0), dict(ops="*"), dict(ops=""),
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
    assert shifted.prompt.translate(str.maketrans("UVWX", "ABCD")) == base.prompt
    assert shifted.answer == base.answer and shifted.roles == base.roles
    with pytest.raises(ValueError):
        task.generate(random.Random(8), d, first_label=task.MAX_STEPS - 2)


@pytest.mark.parametrize("ops", [[("*", 1)], [("+", 10)], [("-", -1)]])
def test_bad_operations_are_rejected(ops):
    with pytest.raises(ValueError, match="operations must be"):
        task.build_example(ops, order=[0], width=4)


# ----------------------------------------------------------------------------- def-use

def _defuse(seed=0, **kw):
    return task.generate(random.Random(seed), task.Difficulty(**kw), task="def-use")


def test_defuse_worked_example_is_exact():
    # A: literal +5; B: definition (register 5000 -> add 5); C: use of B (add 5 again).
    steps = [("lit", ("+", 5)), ("def", None), ("use", 1)]
    ex = task.build_defuse_example(steps, order=[3, 1, 0, 2], width=4)
    assert ex.prompt == "D?;Bu;Af;CB;\n"
    lines = ex.target.split("\n")
    assert lines[0] == "Af" and lines[5] == "Bf" and lines[10] == "CBf"
    assert lines[5:10] == ["Bf", "+5000", "|5000", "+0100", "=0100"]  # 5 + 5 = 10
    assert lines[10:15] == ["CBf", "+5000", "|0100", "+0000", "=5100"]  # 10 + 5 = 15
    assert ex.target.endswith("D?\n#5100") and ex.answer == "5100"
    start = ex.target.index("CBf")
    assert ex.roles[start:start + 4] == "LRTF"
    assert ex.roles[ex.target.index("Bf"):][:2] == "LV"
    assert ex.task_version == task.DEFUSE_VERSION
    assert task.reference_answer(ex.prompt, 4) == ex.answer


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize("width", [1, 3, 10])
def test_defuse_answer_matches_independent_solver(seed, width):
    ex = _defuse(seed, min_steps=1, max_steps=task.MAX_STEPS, width=width)
    assert task.reference_answer(ex.prompt, width) == ex.answer
    assert task.extract_answer(ex.target) == ex.answer


def test_defuse_rows_definitions_and_uses_are_consistent():
    ex = _defuse(5, min_steps=20, max_steps=20)
    items = dict((it[0], it[1]) for it in ex.prompt.strip().split(";") if it)
    lines = ex.target.split("\n")
    register, codes, kinds = "0" * 10, {}, set()
    for k in range(ex.n_steps):
        head, orow, xrow, crow, rrow = lines[5 * k: 5 * k + 5]
        label, spec = head[0], items[head[0]]
        if spec == task.DEF_MARK:
            kinds.add("def")
            assert len(head) == 2 and head[1] == task.encode_op("+", int(register[0]))
        elif spec in task.LABELS_UPPER:
            kinds.add("use")
            assert items[spec] == task.DEF_MARK and spec < label  # an earlier definition
            assert head == label + spec + codes[spec]
        else:
            kinds.add("lit")
            assert head == label + spec
        codes[label] = head[-1]
        op, digit = task.decode_op(head[-1])
        assert orow == op + str(digit) + "0" * 9 and xrow == "|" + register
        x = task.value_lsb(register)
        assert rrow == "=" + task.digits_lsb((x + digit if op == "+" else x - digit) % 10**10, 10)
        register = rrow[1:]
    assert kinds == {"lit", "def", "use"}
    assert lines[5 * ex.n_steps:] == [task.LABELS_UPPER[ex.n_steps] + "?", "#" + register]


@pytest.mark.parametrize("seed", [3, 4])
def test_defuse_trace_retrievals_read_values_that_only_the_trace_holds(seed):
    ex = _defuse(seed)
    t_pos = [i for i, r in enumerate(ex.roles) if r == "T"]
    assert t_pos and set(t_pos) < set(ex.retrieval_positions())
    for i in t_pos:
        ref = ex.target[i - 1]
        assert ex.roles[i - 1] == "R"
        home = ex.target.index(ref)  # the definition's own header, earlier in the trace
        assert home < i - 1 and ex.roles[home + 1] == "V"
        assert ex.target[home + 1] == ex.target[i]
        assert (ref + task.DEF_MARK + ";") in ex.prompt  # the prompt does not hold the value


def test_defuse_retrieval_distances_spread_over_the_trace():
    distances = []
    for ex in task.split_examples(8, 20, task.Difficulty(), "def-use"):
        distances += [i - ex.target.index(ex.target[i - 1])
                      for i, r in enumerate(ex.roles) if r == "T"]
    assert len(distances) >= 60
    assert min(distances) < 60 and max(distances) > 600  # one step back up to most of a trace


@pytest.mark.parametrize("steps, order, msg", [
    ([("use", 0)], [0, 1], "earlier definition"),
    ([("lit", ("+", 1)), ("use", 0)], [0, 1, 2], "earlier definition"),
    ([("def", None), ("use", 2), ("def", None)], [0, 1, 2, 3], "earlier definition"),
    ([("mul", 3)], [0, 1], "kind must be"),
    ([("lit", ("*", 3))], [0, 1], "a literal needs"),
    ([("def", None)], [0], "permutation"),
])
def test_defuse_bad_steps_are_rejected(steps, order, msg):
    with pytest.raises(ValueError, match=msg):
        task.build_defuse_example(steps, order, width=4)


def test_unknown_task_is_rejected():
    with pytest.raises(ValueError, match="unknown task 'sum'"):
        task.generate(random.Random(0), task.Difficulty(), task="sum")
    with pytest.raises(ValueError, match="unknown task"):
        next(task.split_examples(1, 1, task.Difficulty(), task="sum"))


def test_defuse_split_file_round_trip_and_versions(tmp_path):
    out = tmp_path / "s.jsonl"
    assert task.main(["--task", "def-use", "--out", str(out), "--seed", "3", "--count", "4"]) == 0
    recs = task.read_split(str(out))
    for rec, ex in zip(recs, task.split_examples(3, 4, task.Difficulty(), "def-use")):
        assert rec["target"] == ex.target and rec["roles"] == ex.roles
        assert rec["task_version"] == task.DEFUSE_VERSION
        assert rec["retrieval"] == ex.retrieval_positions()
    # The same seed gives different problems in the two tasks.
    pe = next(task.split_examples(3, 1, task.Difficulty()))
    assert pe.target != recs[0]["target"]


@pytest.mark.parametrize("name,steps", [
    *((n, (17, 21)) for n in ["defuse-dev", "defuse-heldout-52361", "defuse-heldout-60017",
                              "defuse-heldout-71993"]),
    # 8-12 steps: the length the two-task model (models/tiny-reasoner-2task) was trained for
    *((n, (8, 12)) for n in ["defuse12-dev", "defuse12-heldout-83117", "defuse12-heldout-90533",
                             "defuse12-heldout-97241"])])
def test_committed_defuse_splits_are_reproducible(name, steps):
    recs = task.read_split(str(DATA / f"{name}.jsonl"))
    assert len(recs) == 200 and recs[0]["task_version"] == task.DEFUSE_VERSION
    seed = int(recs[0]["id"].split("-")[0])
    diff = task.Difficulty(**recs[0]["difficulty"])
    assert (diff.min_steps, diff.max_steps) == steps
    regen = task.split_examples(seed, len(recs), diff, "def-use")
    for rec, ex in zip(recs, regen):
        assert rec["target"] == ex.target and rec["answer"] == ex.answer
        assert steps[0] <= rec["n_steps"] <= steps[1]
    # ~52 generated tokens per step
    assert sum(len(r["target"]) + 1 for r in recs) / len(recs) >= 50 * sum(steps) / 2
