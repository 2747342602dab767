"""Seeded, versioned generator of "plan-and-execute" problems for the tiny reasoner.

A problem is a chain of additions and subtractions of one-digit operands on one W-digit
register (arithmetic modulo 10**W). Every number is written least-significant digit first and
zero-padded, so that each digit of a result sits at a fixed distance from the digits it is
computed from.

Every operation is written as ONE code token: ``a``..``j`` add 0..9, ``k``..``t`` subtract 0..9
(CODES). Prompt: the operations, each with a unique uppercase label, in shuffled order::

    Cc;Ac;Bq;

Target (what the model writes):

* the **plan**: the operations in chain order, then the label of the answer step with ``?``.
  Writing plan line ``B`` copies the code after prompt label ``B``::

      Ac
      Bq
      Cc
      D?

* the **execution**, one block of five rows per operation::

      Bq               header: re-reads plan line B far back (the retrieval token "q")
      -6000000000      the operand the code stands for, padded to W digits (local decode)
      |2000000000      register before the step (copy of the previous result row)
      -0111111111      carries (``+``) or borrows (``-``), c_0 .. c_{W-1}
      =6999999999      register after the step

* the **answer**: the header ``D?`` re-read from the plan, then ``#`` and the register.

Every far-back retrieval is ONE token right after a single-token label, the copy a small
transformer learns with an induction head. Version 3 re-read a 4-token operation after the
label; a 4-layer model learned the first token but not the digits behind it at distances beyond
~250 tokens (docs/testbed.md). A label occurs once in the prompt and once in the plan with the
same code after it, so a copy from either is right.

Each example carries one role character per target token (the tokenizer is character level,
so target token i is ``target[i]``); see ROLES.

A second task, **define-and-use** (``def-use``, version DEFUSE_VERSION), has a different
revisit structure: there is no plan, and some operations are defined in the middle of the trace
and re-read from there. Prompt items are ``Lc`` (a literal operation), ``Lu`` (a *definition*:
its code is computed in the trace, add digit 0 of the register before the step) or ``LM``
(a *use*: the same code as the earlier definition M), plus the answer item ``N?``; shuffled::

    Cu;Ej;DC;Ac;F?;Bu;

Step headers: ``Ac`` (literal: the code re-read from the prompt, far back), ``Bc`` (definition:
the code computed from the register row 11 tokens back), ``DCc`` (use: the label M re-read from
the prompt, then M's code re-read from M's own header, somewhere earlier in the trace). The rows
below a header and the answer are as in plan-and-execute.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from typing import Iterator

TASK_VERSION = "plan-exec-v4"
DEFUSE_VERSION = "def-use-v1"
TASKS = {"plan-exec": TASK_VERSION, "def-use": DEFUSE_VERSION}  # task name -> version
DEF_MARK = "u"  # prompt item "Lu": step L's code is defined in the trace

LABELS_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_STEPS = len(LABELS_UPPER) - 1  # the last label is kept for the answer step
CODES = {"+": "abcdefghij", "-": "klmnopqrst"}  # CODES[op][digit]
# Every character a problem can contain, plus lowercase u..z (unused since version 4), kept so
# that the vocabulary and token ids match the checkpoint version 4 was fine-tuned from.
ALPHABET = "\n#+-;=?|0123456789" + LABELS_UPPER + LABELS_UPPER.lower()

# Role of every target character.
ROLES = {
    "L": "label: plan-line or step label (next letter, locally predictable)",
    "P": "plan: operation code copied from the prompt by its label",
    "R": "retrieval: header re-reading its plan line far back (keyed by the label); in "
         "def-use, the code or the referenced label re-read from the prompt",
    "T": "trace retrieval (def-use): the code of an earlier definition, re-read from that "
         "step's header in the middle of the trace",
    "V": "defined value (def-use): the code computed from the register row (local)",
    "O": "operand row: the operation and digit the header's code stands for, zero padded (local)",
    "X": "register copy: the previous step's result row, 27 tokens back at W=10",
    "C": "carry or borrow digit (local arithmetic)",
    "D": "result digit (local arithmetic)",
    "A": "answer digit",
    "F": "format: newlines and row prefixes",
}


def encode_op(op: str, digit: int) -> str:
    return CODES[op][digit]


def decode_op(code: str) -> tuple[str, int]:
    for op, letters in CODES.items():
        if code in letters:
            return op, letters.index(code)
    raise ValueError(f"not an operation code: {code!r}")


@dataclasses.dataclass(frozen=True)
class Difficulty:
    """Knobs of the generator. Lengths are exact functions of n_steps and width."""

    min_steps: int = 17
    max_steps: int = 21
    width: int = 10  # digits of the register
    ops: str = "+-"

    def validate(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps <= MAX_STEPS:
            raise ValueError(f"steps must satisfy 1 <= min <= max <= {MAX_STEPS}, got "
                             f"{self.min_steps}..{self.max_steps}")
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if not self.ops or set(self.ops) - set("+-"):
            raise ValueError(f"ops must be a non-empty subset of '+-', got {self.ops!r}")


@dataclasses.dataclass
class Example:
    prompt: str
    target: str  # reference output, without the end-of-sequence token
    answer: str  # final register, least-significant digit first
    roles: str  # one ROLES character per target character
    n_steps: int
    task_version: str = TASK_VERSION

    def retrieval_positions(self) -> list[int]:
        """Target positions of the far-back copies (roles R and T)."""
        return [i for i, r in enumerate(self.roles) if r in "RT"]

    def to_json(self, problem_id: str) -> dict:
        return {
            "id": problem_id,
            "task_version": self.task_version,
            "n_steps": self.n_steps,
            "prompt": self.prompt,
            "answer": self.answer,
            "target": self.target,
            "roles": self.roles,
            "retrieval": self.retrieval_positions(),
        }


def digits_lsb(value: int, width: int) -> str:
    """`value` as `width` digits, least-significant first."""
    return str(value).zfill(width)[::-1]


def value_lsb(text: str) -> int:
    return int(text[::-1])


def _execute(op: str, x: str, y: str) -> tuple[str, str]:
    """Carry/borrow row (c_0..c_{W-1}) and result row of x op y, all least-significant first."""
    carries, result, c = [], [], 0
    for xd, yd in zip(x, y):
        carries.append(str(c))
        s = int(xd) + int(yd) + c if op == "+" else int(xd) - int(yd) - c
        if op == "+":
            result.append(str(s % 10))
            c = 1 if s >= 10 else 0
        else:
            result.append(str(s % 10))
            c = 1 if s < 0 else 0
    return "".join(carries), "".join(result)


class _Writer:
    """Accumulates target text together with its role marks."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.roles: list[str] = []

    def put(self, text: str, role: str) -> None:
        self.text.append(text)
        self.roles.append(role * len(text))

    def result(self) -> tuple[str, str]:
        return "".join(self.text), "".join(self.roles)


def build_example(ops: list[tuple[str, int]], order: list[int], width: int,
                  first_label: int = 0) -> Example:
    """Build prompt, target and roles for operations `ops` = [(op, digit)] in chain order,
    listed in the prompt in the order `order` (a permutation of range(len(ops))).

    Labels start at letter `first_label` (0 = A). Splits always use 0; training also uses
    other starts so that short problems exercise every label."""
    n = len(ops)
    if not 1 <= n <= MAX_STEPS - first_label or first_label < 0:
        raise ValueError(f"need 1..{MAX_STEPS - first_label} operations when labels start at "
                         f"{first_label}, got {n}")
    labels = LABELS_UPPER[first_label:]
    if sorted(order) != list(range(n)):
        raise ValueError("order must be a permutation of the operation indices")
    if any(op not in CODES or not 0 <= v <= 9 for op, v in ops):
        raise ValueError("operations must be ('+' or '-', digit 0..9)")
    codes = [encode_op(op, v) for op, v in ops]
    prompt = "".join(labels[k] + codes[k] + ";" for k in order) + "\n"

    w = _Writer()
    for k in range(n):
        w.put(labels[k], "L")
        w.put(codes[k], "P")
        w.put("\n", "F")
    w.put(labels[n], "L")
    w.put("?", "P")
    w.put("\n", "F")

    register = "0" * width
    for k, (op, v) in enumerate(ops):
        w.put(labels[k], "L")
        w.put(codes[k], "R")
        w.put("\n", "F")
        register = _put_step(w, op, v, register)
    w.put(labels[n], "L")
    w.put("?", "R")
    w.put("\n#", "F")
    w.put(register, "A")
    target, roles = w.result()
    return Example(prompt=prompt, target=target, answer=register, roles=roles, n_steps=n)


def _put_step(w: _Writer, op: str, digit: int, register: str) -> str:
    """The operand, register, carry and result rows of one step; returns the new register."""
    operand = str(digit) + "0" * (len(register) - 1)
    w.put(op + operand, "O")
    w.put("\n|", "F")
    w.put(register, "X")
    w.put("\n" + op, "F")
    carries, result = _execute(op, register, operand)
    w.put(carries, "C")
    w.put("\n=", "F")
    w.put(result, "D")
    w.put("\n", "F")
    return result


def build_defuse_example(steps: list[tuple[str, object]], order: list[int], width: int,
                         first_label: int = 0) -> Example:
    """A define-and-use problem. `steps` in chain order, each ("lit", (op, digit)),
    ("def", None) or ("use", k) with k the index of an earlier "def" step; the prompt lists
    the items (and the answer item, index len(steps)) in the order `order`, a permutation of
    range(len(steps) + 1)."""
    n = len(steps)
    if not 1 <= n <= MAX_STEPS - first_label or first_label < 0:
        raise ValueError(f"need 1..{MAX_STEPS - first_label} steps when labels start at "
                         f"{first_label}, got {n}")
    if sorted(order) != list(range(n + 1)):
        raise ValueError("order must be a permutation of the step indices and the answer item")
    labels = LABELS_UPPER[first_label:]
    items = []
    for k, (kind, arg) in enumerate(steps):
        if kind == "lit":
            if not (isinstance(arg, tuple) and len(arg) == 2 and arg[0] in CODES
                    and isinstance(arg[1], int) and 0 <= arg[1] <= 9):
                raise ValueError(f"step {k}: a literal needs ('+' or '-', digit 0..9)")
            items.append(labels[k] + encode_op(*arg))
        elif kind == "def":
            items.append(labels[k] + DEF_MARK)
        elif kind == "use":
            if not (isinstance(arg, int) and 0 <= arg < k and steps[arg][0] == "def"):
                raise ValueError(f"step {k}: a use must name an earlier definition")
            items.append(labels[k] + labels[arg])
        else:
            raise ValueError(f"step {k}: kind must be lit, def or use, got {kind!r}")
    items.append(labels[n] + "?")
    prompt = "".join(items[k] + ";" for k in order) + "\n"

    w = _Writer()
    register = "0" * width
    codes: list[str] = []
    for k, (kind, arg) in enumerate(steps):
        w.put(labels[k], "L")
        if kind == "lit":
            code = encode_op(*arg)
            w.put(code, "R")
        elif kind == "def":
            code = encode_op("+", int(register[0]))
            w.put(code, "V")
        else:
            code = codes[arg]
            w.put(labels[arg], "R")
            w.put(code, "T")
        codes.append(code)
        w.put("\n", "F")
        register = _put_step(w, *decode_op(code), register)
    w.put(labels[n], "L")
    w.put("?", "R")
    w.put("\n#", "F")
    w.put(register, "A")
    target, roles = w.result()
    return Example(prompt=prompt, target=target, answer=register, roles=roles, n_steps=n,
                   task_version=DEFUSE_VERSION)


def generate_defuse(rng: random.Random, diff: Difficulty, first_label: int = 0) -> Example:
    """Step kinds: the first is a literal or a definition (even odds); later ones are a use of
    a uniformly chosen earlier definition (35 %, when there is one), a definition (30 %) or a
    literal."""
    diff.validate()
    n = rng.randint(diff.min_steps, diff.max_steps)
    steps: list[tuple[str, object]] = []
    defs: list[int] = []
    for k in range(n):
        u = rng.random()
        if defs and u < 0.35:
            steps.append(("use", rng.choice(defs)))
        elif u < (0.65 if defs else 0.5):
            defs.append(k)
            steps.append(("def", None))
        else:
            steps.append(("lit", (rng.choice(diff.ops), rng.randrange(10))))
    order = list(range(n + 1))
    rng.shuffle(order)
    return build_defuse_example(steps, order, diff.width, first_label)


def generate(rng: random.Random, diff: Difficulty, first_label: int = 0,
             task: str = "plan-exec") -> Example:
    if task == "def-use":
        return generate_defuse(rng, diff, first_label)
    if task != "plan-exec":
        raise ValueError(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    diff.validate()
    n = rng.randint(diff.min_steps, diff.max_steps)
    ops = [(rng.choice(diff.ops), rng.randrange(10)) for _ in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    return build_example(ops, order, diff.width, first_label)


def reference_answer(prompt: str, width: int) -> str:
    """Solve a prompt of either task directly (independent of the target writers): the final
    register."""
    items = sorted((it for it in prompt.strip().split(";") if it), key=lambda it: it[0])
    value, codes = 0, {}
    for it in items:
        label, spec = it[0], it[1]
        if spec == "?":
            continue
        if spec == DEF_MARK:
            code = encode_op("+", value % 10)  # digit 0 of the register
        elif spec in LABELS_UPPER:
            code = codes[spec]
        else:
            code = spec
        codes[label] = code
        op, y = decode_op(code)
        value = (value + y if op == "+" else value - y) % 10 ** width
    return digits_lsb(value, width)


def extract_answer(generated: str) -> str | None:
    """The digits of the final `#` line, or None when the output has no answer line."""
    last = generated.rstrip("\n").split("\n")[-1]
    if not last.startswith("#"):
        return None
    return last[1:]


def split_examples(seed: int, count: int, diff: Difficulty,
                   task: str = "plan-exec") -> Iterator[Example]:
    """`count` problems; problem i depends only on (the task's version, seed, i) and `diff`."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    for i in range(count):
        yield generate(random.Random(f"{TASKS[task]}:{seed}:{i}"), diff, task=task)


def write_split(path: str, seed: int, count: int, diff: Difficulty,
                task: str = "plan-exec") -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, ex in enumerate(split_examples(seed, count, diff, task)):
            rec = ex.to_json(f"{seed}-{i}")
            rec["difficulty"] = dataclasses.asdict(diff)
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def read_split(path: str) -> list[dict]:
    """The problems of a .jsonl split; ValueError naming the line and field of a bad record."""
    import os

    from .validate import check_problem

    name = os.path.basename(path)
    recs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{name} line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            recs.append(check_problem(rec, where))
    return recs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m beaconkv.task",
        description="Write a split of problems of one task (one JSON object a line).")
    p.add_argument("--out", required=True, help="output .jsonl path")
    p.add_argument("--task", choices=list(TASKS), default="plan-exec",
                   help="plan-exec (re-reads a plan written first) or def-use (re-reads values "
                        "defined anywhere earlier in the trace)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--count", type=int, default=200)
    d = Difficulty()
    p.add_argument("--min-steps", type=int, default=d.min_steps)
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--width", type=int, default=d.width)
    p.add_argument("--ops", default=d.ops)
    a = p.parse_args(argv)
    diff = Difficulty(a.min_steps, a.max_steps, a.width, a.ops)
    try:
        diff.validate()
    except ValueError as e:
        p.error(str(e))
    write_split(a.out, a.seed, a.count, diff, a.task)
    exs = read_split(a.out)
    mean_len = sum(len(e["target"]) + 1 for e in exs) / len(exs)
    print(f"wrote {len(exs)} problems to {a.out}; mean generated length {mean_len:.1f} tokens "
          f"(with end-of-sequence)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
