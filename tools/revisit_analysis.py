#!/usr/bin/env python3
"""Revisit analysis of the shipped tiny reasoner (see docs/testbed.md).

    python3 tools/revisit_analysis.py            # 20 dev problems -> docs/testbed_*.png/json

Options of `python -m beaconkv.revisit` given here override the defaults."""

import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "integration"))

import beaconkv.revisit as revisit  # noqa: E402

DEFAULTS = ["--model", "models/tiny-reasoner", "--split", "models/tiny-reasoner/data/dev.jsonl",
            "--num", "20", "--out", "docs"]  # relative to the repository root

if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(revisit.main(DEFAULTS + sys.argv[1:]))  # later options override the defaults
