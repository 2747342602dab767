"""The core's policy registry, and every entry point asking it: the same command line gives the
same configuration in `eval`, `generate`, `analyze --replay`, `bench throughput`, the study
tools and the vLLM config; an unknown knob is an error in each."""

import json
import os

import pytest

import beaconkv

from conftest import load_tool  # tests/python/conftest.py

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-reasoner")


# ---------------------------------------------------------------------------------------
# The registry as Python sees it.

def test_registry_lists_every_policy_with_the_config_classes_knobs():
    specs = beaconkv.policy_specs()
    assert [s.name for s in specs] == beaconkv.policy_names()
    assert [s.name for s in specs if not s.budgeted] == ["full"]
    for s in specs:
        cfg = beaconkv.policy_config(s.name)
        assert list(type(cfg)._fields) == [k.name for k in s.knobs]
        assert cfg.to_dict() == {k.name: k.default for k in s.knobs}
        for k in s.knobs:
            assert k.type in ("int", "float", "bool", "choice", "ints")
            assert bool(k.choices) == (k.type == "choice") and k.help
            if k.type == "int":
                assert k.min <= k.default <= k.max
    beacon = beaconkv.policy_spec("beacon")
    mode = next(k for k in beacon.knobs if k.name == "budget_mode")
    assert mode.choices == ["uniform", "pooled"] and mode.default == "uniform"
    assert next(k for k in beaconkv.policy_spec("rpc").knobs if k.name == "pooling").choices == [
        "max", "avg", "none"]
    offsets = next(k for k in beacon.knobs if k.name == "layer_budget_offsets")
    assert offsets.type == "ints" and offsets.default == ""  # a list, as its '/' text
    with pytest.raises(ValueError, match="unknown policy"):
        beaconkv.policy_spec("lru")


def test_make_policy_config_reads_specs_budgets_and_knobs():
    make = beaconkv.make_policy_config
    assert make("beacon-pooled:n_recent=32", 96, interval=16, knobs={"n_beacons": 4}) == \
        beaconkv.BeaconConfig(budget=96, interval=16, n_recent=32, n_beacons=4,
                              budget_mode="pooled")
    # Knobs as a list of NAME=VALUE strings (the command line) or a dict (Python) agree.
    assert make("snapkv", 64, knobs=["window=4", "pooling=avg"]) == \
        make("snapkv", 64, knobs={"window": 4, "pooling": "avg"})
    assert make("rpc", 64).period == 256 and make("rpc:period=512", 64).period == 512
    assert make("rpc", 64, knobs=["ratio=2"]).period == 128
    assert make("full", 64) == beaconkv.FullConfig()
    assert beaconkv.policy_budget(make("rpc", 64)) == 64
    assert beaconkv.policy_budget(make("full", 64)) is None
    assert make("beacon", knobs=["budget=80"]).budget == 80  # a budget knob is the budget
    with pytest.raises(ValueError, match="disagree"):
        make("beacon", 64, knobs=["budget=80"])
    with pytest.raises(ValueError, match="given twice"):
        make("beacon", knobs=["n_recent=4", "n_recent=8"])
    with pytest.raises(ValueError, match="budget must be an integer"):
        make("beacon", "64")
    with pytest.raises(ValueError, match="expected NAME=VALUE"):
        make("beacon", knobs=["n_recent"])
    assert make("beacon", 96, knobs=["redundancy=1"]).redundancy == 1.0
    assert beaconkv.BeaconConfig().redundancy == 0.0  # off by default
    with pytest.raises(ValueError, match="redundancy"):
        make("beacon-pooled", 96, knobs=["redundancy=1"])
    with pytest.raises(ValueError, match="redundancy"):
        make("beacon", 96, knobs=["redundancy=-1"])


# ---------------------------------------------------------------------------------------
# Every entry point. Each runner returns the configuration the entry point hands to the
# engine (or to the replay), stopping it right there; or raises ValueError / SystemExit.

class Reached(Exception):
    """Raised by the stand-in engine or replay with the configuration it was given."""

    def __init__(self, policy):
        super().__init__("reached")
        self.policy = policy


@pytest.fixture
def stop_at_engine(monkeypatch):
    def engine(model_dir, policy="full", **kw):
        raise Reached(policy)

    monkeypatch.setattr(beaconkv, "Engine", engine)


def knob_args(knobs):
    return [a for k in knobs for a in ("--knob", k)]


def cli_main(argv, capsys):
    from beaconkv.cli import main

    rc = main(argv)
    raise ValueError(capsys.readouterr().err) if rc else AssertionError("no error, no engine")


def run_eval(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    cli_main(["eval", "--model", MODEL, "--policy", spec, "--budget", str(budget), "--num", "1",
              *knob_args(knobs)], capsys)


def run_eval_teacher_forced(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    from beaconkv.evaluate import evaluate_teacher_forced

    # The full-cache reference is read from the cache argument, so the policy's run is the
    # first engine this builds.
    evaluate_teacher_forced(MODEL, "dev", spec, budget, num=1, policy_knobs=knobs,
                            full_cache={(os.path.abspath(MODEL), "dev", 1, 16, 16): {}})


def run_generate(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    cli_main(["generate", "--model", MODEL, "--prompt", "a", "--policy", spec, "--budget",
              str(budget), *knob_args(knobs)], capsys)


def run_bench_throughput(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    cli_main(["bench", "throughput", "--model", MODEL, "--num-prompts", "1", "--kv-blocks",
              "400", "--policy", spec, "--budget", str(budget), *knob_args(knobs)], capsys)


def run_analyze_replay(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    from beaconkv import replay, revisit

    def replay_traces(traces, policies, *a, **kw):
        raise Reached(policies[spec])

    # Only the replay's configuration is looked at: the revisit analysis before it is skipped.
    monkeypatch.setattr(revisit, "analyze", lambda *a, **kw: {"summary": {
        "problems": 1, "global_frac_topk": 0.0, "global_frac_weighted": 0.0}})
    monkeypatch.setattr(revisit, "plot", lambda *a, **kw: [])
    monkeypatch.setattr(replay, "replay_traces", replay_traces)
    cli_main(["analyze", "--model", MODEL, "--out", str(tmp_path / "out"), "--num", "1",
              "--replay", "--policies", spec, "--budget", str(budget), *knob_args(knobs)],
             capsys)


def run_study(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    study = load_tool("run_study")
    rc = study.main(["--model", MODEL, "--split", "dev", "--num", "1", "--modes", "greedy",
                     "--budgets", str(budget), "--policies", spec, "--out", str(tmp_path),
                     *knob_args(knobs)])
    raise ValueError(capsys.readouterr().out) if rc else AssertionError("no error, no engine")


def run_error_attribution(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    load_tool("error_attribution").run(MODEL, "dev", spec, budget, None, knobs, 1)


def run_vllm_config(spec, budget, knobs, capsys, tmp_path, monkeypatch):
    from beaconkv.vllm import config

    # The scheduler fills in the served model's directory; here it is given.
    raise Reached(config.parse(json.dumps({"policy": spec, "budget": budget, "knobs": knobs,
                                           "model": MODEL})).policy_config())


ENTRY_POINTS = [run_eval, run_eval_teacher_forced, run_generate, run_bench_throughput,
                run_analyze_replay, run_study, run_error_attribution, run_vllm_config]
COMMAND_LINES = [
    ("rpc", 64, []),
    ("rpc", 48, ["ratio=2"]),
    ("beacon-pooled:n_recent=8", 96, ["interval=16", "n_beacons=4"]),
    ("snapkv", 32, ["window=4", "pooling=avg"]),
    ("h2o", 24, ["recent_fraction=0.25"]),
    ("streaming", 40, ["budget=40"]),
    ("beacon", 96, ["interval=32", "redundancy=1", "redundancy_threshold=0.4"]),
    ("model:n_recent=32", 112, ["interval=16", "blur_layers=2"]),
]


def config_of(runner, line, capsys, tmp_path, monkeypatch):
    with pytest.raises(Reached) as reached:
        runner(*line, capsys, tmp_path, monkeypatch)
    return reached.value.policy


@pytest.mark.parametrize("line", COMMAND_LINES, ids=lambda line: line[0])
@pytest.mark.parametrize("runner", ENTRY_POINTS, ids=lambda r: r.__name__[4:])
def test_every_entry_point_builds_the_same_config(runner, line, stop_at_engine, capsys,
                                                  tmp_path, monkeypatch):
    spec, budget, knobs = line
    expected = beaconkv.make_policy_config(spec, budget, knobs=knobs, model=MODEL)
    got = config_of(runner, line, capsys, tmp_path, monkeypatch)
    assert got == expected
    if spec == "rpc":  # the budget reaches rpc everywhere, through its period
        assert got.period == got.ratio * budget


@pytest.mark.parametrize("runner", ENTRY_POINTS, ids=lambda r: r.__name__[4:])
@pytest.mark.parametrize("spec,knob", [("tova", "n_beacons=4"), ("beacon", "n_beaconz=4"),
                                       ("rpc", "interval=8")])
def test_an_unknown_knob_is_an_error_everywhere(runner, spec, knob, stop_at_engine, capsys,
                                                tmp_path, monkeypatch):
    name = knob.split("=")[0]
    with pytest.raises(ValueError, match=f"policy {spec} has no knob '{name}'"):
        runner(spec, 64, [knob], capsys, tmp_path, monkeypatch)


# --- the policy a model recommends ("model") -------------------------------------------------

def model_dir_with(tmp_path, **fields):
    """A copy of the shipped model's config.json with `fields` set (None: removed)."""
    cfg = json.loads(open(os.path.join(MODEL, "config.json")).read())
    for k, v in fields.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_model_names_the_shipped_models_setting_with_the_users_knobs_on_top():
    spec = json.loads(open(os.path.join(MODEL, "config.json")).read())["beaconkv_policy"]
    assert beaconkv.model_policy_spec(MODEL) == spec
    assert beaconkv.make_policy_config("model", 96, model=MODEL) == \
        beaconkv.make_policy_config(spec, 96)
    for name in ("model", "model-pooled", "model:interval=16"):
        assert beaconkv.names_model_policy(name)
    for name in ("beacon", "beacon-pooled:blur_layers=3", "models"):
        assert not beaconkv.names_model_policy(name)
    # Knobs given on top win; the model's others stay.
    cfg = beaconkv.make_policy_config("model:blur_layers=2", 96, knobs=["interval=16"],
                                      model=MODEL)
    assert (cfg.blur_layers, cfg.interval) == ("2", 16)
    assert cfg.budget_mode == "pooled" and cfg.layer_budget_offsets == "0/-16/16/0"
    # Other policies ignore the model's setting.
    assert beaconkv.make_policy_config("beacon", 96, model=MODEL) == \
        beaconkv.make_policy_config("beacon", 96)


def test_model_without_a_model_policy_says_so(tmp_path):
    with pytest.raises(ValueError, match="no model policy was given"):
        beaconkv.make_policy_config("model", 96)
    none = model_dir_with(tmp_path, beaconkv_policy=None)
    assert beaconkv.model_policy_spec(none) is None
    with pytest.raises(ValueError, match="config.json names no policy of the model"):
        beaconkv.make_policy_config("model", 96, model=none)
    assert beaconkv.make_policy_config("beacon", 96, model=none).budget == 96


@pytest.mark.parametrize("value,says", [
    (7, "must be a policy spec string"),
    ("beacon:n_becons=3", "no knob 'n_becons'"),
    ("beacon:budget=64", "it sets 'budget'"),
    ("rpc:period=512", "it sets 'period'"),
    ("model", "must name a policy of the registry"),
])
def test_a_malformed_model_policy_names_the_file(tmp_path, value, says):
    d = model_dir_with(tmp_path, beaconkv_policy=value)
    for call in (lambda: beaconkv.model_policy_spec(d),
                 lambda: beaconkv.make_policy_config("model", 96, model=d)):
        with pytest.raises(ValueError, match=says) as e:
            call()
        assert os.path.join(d, "config.json") in str(e.value)


def test_vllm_config_resolves_model_against_the_served_model(tmp_path):
    from beaconkv.vllm import config

    # Without a directory the check waits for the scheduler (it knows the served model).
    cfg = config.parse(json.dumps({"policy": "model", "budget": 96}))
    assert cfg.model is None and cfg.names_model_policy()
    with pytest.raises(ValueError, match="no model policy was given"):
        cfg.policy_config()
    cfg.model = MODEL  # what the scheduler does
    assert cfg.policy_config() == beaconkv.make_policy_config("model", 96, model=MODEL)
    # The worker process gets the directory with the rest of the config.
    assert config.parse(cfg.to_json()).policy_config() == cfg.policy_config()
    # A directory given in the config is checked at once.
    with pytest.raises(ValueError, match="names no policy of the model"):
        config.parse(json.dumps({"policy": "model", "budget": 96,
                                 "model": model_dir_with(tmp_path, beaconkv_policy=None)}))
    for bad in (3, ""):
        with pytest.raises(ValueError, match="'model' must be a model directory"):
            config.parse(json.dumps({"policy": "beacon", "model": bad}))


def test_the_engine_resolves_model_against_its_own_directory():
    """Engine(DIR, policy="model...") reads DIR's setting; a bare "model" string where no
    directory is known says how to build it."""
    from beaconkv.evaluate import load_problems
    from beaconkv.tokenizer import CharTokenizer

    tok = CharTokenizer.load(MODEL)
    prompt = [tok.bos_id] + tok.encode(load_problems(MODEL, "dev", 1)[0]["prompt"])

    def run(policy):
        eng = beaconkv.Engine(MODEL, policy=policy, num_threads=1)
        eng.add_request(0, prompt, max_new_tokens=300)
        out = eng.run()[0]
        return out["output"], out["peak_retained_tokens"]

    by_string = run("model:budget=96,interval=16")
    assert by_string == run(beaconkv.make_policy_config("model", 96, knobs=["interval=16"],
                                                        model=MODEL))
    assert by_string[1] < len(prompt) + len(by_string[0])  # it evicted
    with pytest.raises(ValueError, match="needs the model directory"):
        beaconkv.policy_budget("model")
