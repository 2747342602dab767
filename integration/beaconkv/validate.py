"""Validation at the boundary: command-line arguments and split-file records.

Every check raises with a message that names the field (``--budget``,
``dev.jsonl line 3: field 'target'``) so the CLI can print one line instead of a traceback.
Argument checks raise ``argparse.ArgumentTypeError`` (argparse adds the option name and exits
with status 2); record checks raise ``ValueError``. Policy names and knobs are the core's
registry's to check (``beaconkv.make_policy_config``).
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


def policy_help() -> str:
    """The --policy help text, with the policy names the core's registry lists."""
    import beaconkv

    budgeted = [s.name for s in beaconkv.policy_specs() if s.budgeted]
    return (f"policy spec NAME[-pooled][:KNOB=VALUE,...]; NAME one of "
            f"{', '.join(beaconkv.policy_names())} (budgeted: {', '.join(budgeted)}; "
            f"knobs: beaconkv.policy_spec(NAME).knobs), or {beaconkv.MODEL_POLICY!r}: the "
            f"policy the model recommends (its config.json's beaconkv_policy), knobs on top")


def split_help(model_dir: str) -> str:
    """The --split help text: the named splits the model directory ships (data/NAME.jsonl)."""
    import os

    data = os.path.join(model_dir, "data")
    names = sorted(f[:-len(".jsonl")] for f in (os.listdir(data) if os.path.isdir(data) else [])
                   if f.endswith(".jsonl"))
    return (f"one of {', '.join(names)} (the model's data/NAME.jsonl), or a .jsonl file"
            if names else "a .jsonl file (the model directory has no data/NAME.jsonl)")


def knob_help() -> str:
    return ("override a policy knob (repeatable), e.g. --knob interval=32; a knob the policy "
            "does not have is an error")


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
