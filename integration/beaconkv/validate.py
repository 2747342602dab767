"""Validation at the boundary: command-line arguments, policy knobs and split-file records.

Every check raises with a message that names the field (``--budget``, ``knob 'n_beacons'``,
``dev.jsonl line 3: field 'target'``) so the CLI can print one line instead of a traceback.
Argument checks raise ``argparse.ArgumentTypeError`` (argparse adds the option name and exits
with status 2); knob and record checks raise ``ValueError``.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1


def int_arg(lo: int, hi: int = INT32_MAX) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in [lo, hi] (the C++ field it feeds bounds ``hi``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo}, {hi}]")
        return value

    parse.__name__ = "integer"
    return parse


def float_arg(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite float in [lo, hi] ((lo, hi] when ``lo_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
        if not ok:
            raise argparse.ArgumentTypeError(
                f"{text} is outside {'(' if lo_open else '['}{lo}, {hi}]")
        return value

    parse.__name__ = "number"
    return parse


def parse_knobs(items: list[str] | None) -> dict:
    """['n_beacons=8', 'pooling=max'] -> {'n_beacons': 8, 'pooling': 'max'}.

    Values are JSON when they parse as JSON (numbers, true/false), else strings; the policy
    config then checks each knob's name and type."""
    import json

    knobs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--knob {item!r}: expected NAME=VALUE")
        if key in knobs:
            raise ValueError(f"--knob {key!r} is given twice")
        try:
            knobs[key] = json.loads(value)
        except json.JSONDecodeError:
            knobs[key] = value
    return knobs


def merge_budget(budget: int | None, knobs: dict) -> tuple[int | None, dict]:
    """``--knob budget=N`` is the same as ``--budget N``: fold it in, or refuse a conflict."""
    if "budget" not in knobs:
        return budget, knobs
    knobs = dict(knobs)
    value = knobs.pop("budget")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
        raise ValueError(f"--knob budget={value!r}: expected an integer in [1, {INT32_MAX}]")
    if budget is not None and budget != value:
        raise ValueError(f"--budget {budget} and --knob budget={value} disagree; give one")
    return value, knobs


# Split files (.jsonl): one problem per line. Required fields and their types.
_REQUIRED = {"prompt": str, "target": str, "answer": str}


def check_problem(rec: object, where: str) -> dict:
    """Validates one split record; `where` ("dev.jsonl line 3") prefixes every message."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for field, kind in _REQUIRED.items():
        if field not in rec:
            raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(rec[field], kind):
            raise ValueError(f"{where}: field {field!r} must be a {kind.__name__}, "
                             f"got {type(rec[field]).__name__}")
    if not rec["prompt"]:
        raise ValueError(f"{where}: field 'prompt' is empty")
    ret = rec.get("retrieval", [])
    if not isinstance(ret, list):
        raise ValueError(f"{where}: field 'retrieval' must be a list of target positions, "
                         f"got {type(ret).__name__}")
    n = len(rec["target"]) + 1  # target tokens + the end-of-sequence token
    for i, pos in enumerate(ret):
        if isinstance(pos, bool) or not isinstance(pos, int):
            raise ValueError(f"{where}: field 'retrieval'[{i}] must be an integer, got {pos!r}")
        if not 0 <= pos < n:
            raise ValueError(f"{where}: field 'retrieval'[{i}] = {pos} is outside the target's "
                             f"{n} positions [0, {n})")
    roles = rec.get("roles")
    if roles is not None and (not isinstance(roles, str) or len(roles) != len(rec["target"])):
        raise ValueError(f"{where}: field 'roles' must be a string with one character per "
                         f"target character ({len(rec['target'])})")
    return rec
