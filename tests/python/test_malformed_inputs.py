"""Runs the malformed-input corpus (tests/malformed/corpus.py): every case must raise its
expected exception class with its message fragment — never crash, hang, or allocate more
than the address-space limit allows. The cases run in worker processes under RLIMIT_AS
(``ulimit -v``); a worker that dies is restarted after the case it died in, which is then
reported as crashed with the signal."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("beaconkv._beaconkv")

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_DIR = os.path.join(HERE, "..", "malformed")
sys.path.insert(0, CORPUS_DIR)
import corpus  # noqa: E402

NAMES = [c.name for c in corpus.CASES]


def test_corpus_is_large_and_names_are_unique():
    assert len(NAMES) >= 60
    assert len(set(NAMES)) == len(NAMES)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("malformed")
    out = tmp / "results.jsonl"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in (env.get("PYTHONPATH"), *sys.path) if p])
    res, start = {}, 0
    while start < len(NAMES):
        proc = subprocess.run([sys.executable, os.path.join(CORPUS_DIR, "corpus.py"), str(start),
                               str(out), str(tmp / "work")], env=env, capture_output=True,
                              text=True, timeout=30 * 60)
        started = None
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("started"):
                started = rec["i"]
            else:
                res[rec["i"]] = rec
        if proc.returncode == 0:
            break
        # The worker died inside case `started`: record it and resume after it.
        assert started is not None, proc.stderr[-2000:]
        res[started] = {"cls": f"crash (exit {proc.returncode})", "msg": proc.stderr[-2000:]}
        start = started + 1
    return res


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_malformed_input_gets_a_clear_error(results, index):
    case = corpus.CASES[index]
    got = results.get(index)
    assert got is not None, f"{case.name} did not run"
    assert got["cls"] == case.expected, f"{case.name}: {got['cls']}: {got['msg']}"
    assert case.fragment in got["msg"], f"{case.name}: {got['msg']!r} lacks {case.fragment!r}"
    assert "Traceback" not in got["msg"]
