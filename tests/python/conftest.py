"""Fixtures and helpers shared by the Python tests."""
import importlib.util
import os

import pytest

from beaconkv import reference
from beaconkv.evaluate import load_problems

TINY_REASONER = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny-reasoner")
TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")


def load_tool(name):
    """tools/NAME.py as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def dev_trace():
    """The shipped model, and the first `dev` problem's prompt ids and whole reference trace
    (prompt, target, end of sequence)."""
    model = reference.Model(TINY_REASONER)
    rec = load_problems(TINY_REASONER, "dev", 1)[0]
    prompt = model.encode_prompt(rec["prompt"])
    return model, prompt, prompt + model.tokenizer.encode(rec["target"]) + [
        model.tokenizer.eos_id]
