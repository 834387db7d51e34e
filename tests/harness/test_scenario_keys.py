"""Scenario files: every error names file:line: key.path: message, at the key it is about, and
is found when the file is loaded (`run --list` exits 2), before anything is written or
launched: replay options and runtimes, synthetic traces, an engine's own model, cell names
that are the sweep's own files, duplicate keys, the engine's refusals, plain text."""

from __future__ import annotations

import dataclasses
import io
import json
import textwrap
from pathlib import Path

import pytest

from harness import scenario as sc
from harness.cli import main
from harness.scenario import ScenarioError, load_scenario

REPO = Path(__file__).resolve().parent.parent.parent


def scenario(tmp_path: Path, *, trace: str = "  limit: 3", top: str = "",
             engine: str = "", path: str = "azure_conv_excerpt.csv") -> Path:
    """A scenario file. Its lines: trace 3, path 4, ``trace`` 5 (one line unless given more),
    model 6, gpu 7, ``top``, engines 8, the engine's name 9, engine 10, ``engine`` 11."""
    file = tmp_path / "s.yaml"
    file.write_text(textwrap.dedent("""\
        name: demo
        question: Is it right?
        trace:
          path: {path}
        {trace}
        model: llama-3.1-8b
        gpu: h100-sxm
        {top}engines:
          - name: r
            engine: reference
            {engine}
        """).format(trace=trace, top=top, engine=engine, path=path))
    return file


def error_of(path: Path) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return info.value


def where(err: ScenarioError) -> tuple[int | None, str]:
    return err.line, err.key


def listed(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``batchlab run PATH --list``: its exit status and stderr."""
    code = main(["run", str(path), "--list"])
    return code, capsys.readouterr().err


LIVE = "mode: live\n    "  # a served reference engine: live options apply, nothing starts


# ---------------------------------------------------------------- replay options, runtime


def test_a_misspelt_replay_option_is_refused_at_load_with_a_suggestion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It passed --list and failed in the cell, after the server was launched."""
    path = scenario(tmp_path, engine=LIVE + "replay: {timeot_s: 5}")
    err = error_of(path)
    assert where(err) == (12, "engines[0].replay.timeot_s")
    assert err.message.startswith("unknown key; did you mean 'timeout_s'? (known keys: protocol, ")
    code, stderr = listed(path, capsys)
    assert code == 2 and f"{path}:12: engines[0].replay.timeot_s: unknown key" in stderr


@pytest.mark.parametrize(("replay", "key", "message"), [
    ("{timeout_s: -1}", "timeout_s", "must be a positive number of seconds, got -1.0"),
    ("{timeout_s: soon}", "timeout_s", "must be a number, got text ('soon')"),
    ("{max_concurrency: 0}", "max_concurrency", "must be at least 1, got 0"),
    ("{timings_per_token: 1}", "timings_per_token", "must be true or false, got a number (1)"),
    ("{protocol: chatt}", "protocol", "'chatt' is not one of"),
    ("{spin_window_s: 2}", "spin_window_s", "must be in [0, 1) seconds, got 2.0"),
    ("{slo: {ttft_s: 1}}", "slo",
     "is not a replay option of a scenario: the scenario's slo sets it"),
    ("{concurrency: 4}", "concurrency",
     "is not a replay option of a scenario: load.concurrencies sets it"),
])
def test_replay_options_are_checked_as_the_replay_checks_them(
        replay: str, key: str, message: str, tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, engine=LIVE + f"replay: {replay}"))
    assert where(err) == (12, f"engines[0].replay.{key}")
    assert err.message.startswith(message)


def test_replay_options_are_checked_with_each_load_points_loop(tmp_path: Path) -> None:
    """max_concurrency caps an open loop: with load.concurrencies (a closed loop) the replay
    would refuse it in the cell."""
    err = error_of(scenario(tmp_path, top="load: {concurrencies: [2]}\n",
                            engine=LIVE + "replay: {max_concurrency: 4}"))
    assert where(err) == (13, "engines[0].replay.max_concurrency")
    assert "load.concurrencies runs a closed loop" in err.message


def test_good_replay_options_reach_the_cell(tmp_path: Path) -> None:
    path = scenario(tmp_path, engine=LIVE + "replay: {timeout_s: 30, max_concurrency: 8, "
                                            "protocol: openai-chat, timings_per_token: true}")
    engine = load_scenario(path).engines[0]
    assert engine.replay == {"timeout_s": 30.0, "max_concurrency": 8, "protocol": "openai-chat",
                             "timings_per_token": True}


def test_the_replay_options_a_scenario_sets_are_the_replay_configs_fields() -> None:
    """Every ReplayConfig field is either a scenario's replay option or set for it."""
    from harness.live.config import ReplayConfig
    from harness.scenario.load import REPLAY_OPTION_TYPES, REPLAY_SET_FOR_IT

    fields = {f.name for f in dataclasses.fields(ReplayConfig)}
    assert set(REPLAY_OPTION_TYPES) | set(REPLAY_SET_FOR_IT) == fields
    assert not set(REPLAY_OPTION_TYPES) & set(REPLAY_SET_FOR_IT)


def test_a_misspelt_runtime_is_refused_at_load(tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, engine=LIVE + "runtime: dockr"))
    assert where(err) == (12, "engines[0].runtime")
    assert err.message == "'dockr' is not one of native, docker, podman; did you mean 'docker'?"
    path = scenario(tmp_path, engine=LIVE + "runtime: native")
    assert load_scenario(path).engines[0].runtime == "native"


# ---------------------------------------------------------------- synthetic traces

SYNTHETIC = "  num_requests: 6\n  prompt_tokens: 64\n  output_tokens: 8"


@pytest.mark.parametrize("spec", ["synthetic", "synthetic:poisson", "synthetic:gamma",
                                  "synthetic:constant"])
def test_a_synthetic_trace_loads(spec: str, tmp_path: Path) -> None:
    loaded = load_scenario(scenario(tmp_path, path=spec, trace=SYNTHETIC + "\n  rate: 4"))
    assert loaded.trace.path == spec and loaded.trace.file is None
    assert loaded.as_dict()["trace"]["path"] == spec
    trace = sc.load_cell_trace(loaded, loaded.cells()[0].load)
    assert len(trace.requests) == 6 and trace.format == "synthetic"


def test_a_synthetic_trace_runs_end_to_end(tmp_path: Path) -> None:
    """Rates from the load points, lengths sampled from a bundled excerpt; then N users."""
    path = scenario(tmp_path, path="synthetic:gamma", top="load: {rates: [2, 8]}\n",
                    trace="  num_requests: 5\n  burstiness: 0.5\n"
                          "  lengths_from: sharegpt_lengths_excerpt.csv")
    loaded = load_scenario(path)
    quiet = sc.SweepProgress(2, stream=io.StringIO(), tty=False)
    result = sc.run_scenario(loaded, tmp_path / "out", progress=quiet)
    assert [o.state for o in result.outcomes] == ["done", "done"]
    for cell in loaded.cells():
        manifest = json.loads((tmp_path / "out" / "demo" / cell.name / "manifest.json")
                              .read_text())
        assert manifest["trace"]["format"] == "synthetic"
        assert manifest["trace"]["num_requests"] == 5
    assert result.report is not None and "synthetic:gamma" in result.report.read_text()
    closed = path.read_text().replace("rates: [2, 8]", "concurrencies: [2]")
    path.write_text(closed)
    result = sc.run_scenario(load_scenario(path), tmp_path / "closed",
                             progress=sc.SweepProgress(1, stream=io.StringIO(), tty=False))
    assert [o.state for o in result.outcomes] == ["done"]


def test_run_trace_synthetic_replaces_the_scenarios_trace_file(tmp_path: Path) -> None:
    """`batchlab run S.yaml --trace synthetic`, as the other commands' --trace takes it."""
    path = scenario(tmp_path, trace=SYNTHETIC + "\n  rate: 4")
    assert where(error_of(path)) == (5, "trace.num_requests")  # options of a synthetic trace
    loaded = load_scenario(path, trace_path="synthetic:constant")
    assert loaded.trace.path == "synthetic:constant"
    trace = sc.load_cell_trace(loaded, loaded.cells()[0].load)
    assert [r.arrival_s for r in trace.requests] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]


@pytest.mark.parametrize(("path", "trace", "top", "at", "message"), [
    # a trace file with format synthetic: passed --list, then `run` refused it
    ("azure_conv_excerpt.csv", "  format: synthetic\n  num_requests: 10", "",
     (5, "trace.format"), "synthetic reads no trace file (azure_conv_excerpt.csv): generate "
     "requests with path: synthetic"),
    ("azure_conv_excerpt.csv", "  num_requests: 10", "", (5, "trace.num_requests"),
     "applies to synthetic traces (path: synthetic); limit: N keeps the first N requests"),
    ("azure_conv_excerpt.csv", "  lengths_from: sharegpt_lengths_excerpt.csv", "",
     (5, "trace.lengths_from"), "applies to synthetic traces (path: synthetic)"),
    ("synthetic", "  format: azure", "", (5, "trace.format"),
     "azure reads a trace file; path 'synthetic' generates requests"),
    ("synthetic:poison", SYNTHETIC, "", (4, "trace.path"),
     "'synthetic:poison': expected synthetic or synthetic:<poisson|gamma|constant>; did you "
     "mean 'poisson'?"),
    ("synthetic:poisson", SYNTHETIC + "\n  rate: 2\n  arrival: gamma", "",
     (9, "trace.arrival"), "arrival gamma asks for gamma arrivals; path synthetic:poisson "
     "draws poisson arrivals"),
    ("synthetic", "  prompt_tokens: 64\n  output_tokens: 8\n  rate: 2", "",
     (4, "trace.num_requests"), "is required for a synthetic trace (path: synthetic)"),
    ("synthetic", "  num_requests: 6\n  rate: 2", "", (4, "trace.prompt_tokens"),
     "a synthetic trace needs its lengths: prompt_tokens and output_tokens, or lengths_from"),
    ("synthetic", SYNTHETIC, "", (4, "trace.rate"),
     "is required for a synthetic trace (requests per second), in the trace or as load.rates"),
    ("synthetic", SYNTHETIC + "\n  rate: 2\n  start_s: 5", "", (9, "trace.start_s"),
     "a synthetic trace has no timestamps"),
    ("synthetic", SYNTHETIC + "\n  time_scale: 2", "", (8, "trace.time_scale"),
     "rescales a trace's timestamps; a synthetic trace's arrivals are drawn at its rate"),
    ("synthetic", SYNTHETIC, "load: {time_scales: [1, 2]}\n", (10, "load.time_scales[0]"),
     "a synthetic trace's arrivals are drawn at a rate, not rescaled: give load.rates"),
])
def test_a_synthetic_trace_is_refused_at_the_key_load_trace_would_refuse(
        path: str, trace: str, top: str, at: tuple[int, str], message: str,
        tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, path=path, trace=trace, top=top))
    assert where(err) == at
    assert err.message.startswith(message), err.message


def test_a_synthetic_trace_is_no_part_of_a_mix(tmp_path: Path) -> None:
    mix = "  mix:\n    - {path: synthetic, num_requests: 3, prompt_tokens: 8, output_tokens: 2}"
    err = error_of(scenario(tmp_path, trace=mix))
    assert where(err) == (6, "trace.mix[0].path")
    assert "a synthetic trace has none, its arrivals are drawn at a rate" in err.message


def test_the_format_refusal_stops_run_list(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, trace="  format: synthetic\n  num_requests: 10")
    code, stderr = listed(path, capsys)
    assert code == 2 and f"{path}:5: trace.format: synthetic reads no trace file" in stderr


# ---------------------------------------------------------------- an engine's own model


def test_an_engines_unknown_model_is_named_at_its_own_key(tmp_path: Path) -> None:
    """It was blamed on the scenario's (valid) model line."""
    err = error_of(scenario(tmp_path, engine="model: nosuch-model"))
    assert where(err) == (11, "engines[0].model")
    assert err.message.startswith("cell r: model: unknown model 'nosuch-model'; known models: ")
    err = error_of(scenario(tmp_path, engine="model: llama-3.2-1B-x"))
    assert where(err) == (11, "engines[0].model")
    assert "unknown model 'llama-3.2-1B-x' (did you mean 'llama-3.2-1b'?); known" in err.message


def test_a_simulated_cell_predicts_for_its_engines_model_as_the_readme_says(
        tmp_path: Path) -> None:
    from harness.scenario.cell import reference_config

    loaded = load_scenario(scenario(tmp_path, engine="model: llama-3.2-1b"))
    config = reference_config(loaded.cells()[0], loaded.model, loaded.gpu)
    assert config.model_spec.name == "llama-3.2-1b"
    readme = (REPO / "scenarios" / "README.md").read_text()
    assert "live only: `model`" not in readme
    assert "- `model`: what this engine runs when not the scenario's `model`" in readme


# ---------------------------------------------------------------- names of cells


@pytest.mark.parametrize("name", ["scenario.json", "report.md", "Report.MD", "throughput.png",
                                  "capacity.json"])
def test_a_cell_cannot_take_the_name_of_a_file_of_its_sweep(name: str, tmp_path: Path) -> None:
    """It passed load, scenario.json was written, then the cell's folder was a file."""
    path = scenario(tmp_path, engine=f"knobs: {{}}\n  - name: '{name}'\n    engine: reference")
    err = error_of(path)
    assert where(err) == (12, "engines[1].name")
    assert err.message.startswith(f"{name!r} is the name of a file the sweep writes in the "
                                  "scenario's folder")
    assert "name the engine otherwise (reserved: scenario.json, report.md, " in err.message


def test_a_cell_named_like_a_file_of_its_sweep_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, engine="knobs: {}\n  - name: report.md\n    engine: reference")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"{path}:12: engines[1].name: 'report.md' is the name of a file" in (
        capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_the_reserved_names_are_the_files_sweeps_and_searches_write() -> None:
    from harness.capacity.run import CAPACITY_FILE
    from harness.capacity.run import SCENARIO_FILE as CAPACITY_SCENARIO_FILE
    from harness.results import REPORT_FILE, REPORT_PLOTS
    from harness.scenario.load import RESERVED_NAMES
    from harness.scenario.runner import SCENARIO_FILE

    assert set(RESERVED_NAMES) == {SCENARIO_FILE, CAPACITY_SCENARIO_FILE, REPORT_FILE,
                                   *REPORT_PLOTS, CAPACITY_FILE}


# ---------------------------------------------------------------- the full key path


def test_a_duplicate_key_is_named_by_its_full_key_path(tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, trace="  limit: 3\n  limit: 4"))
    assert where(err) == (6, "trace.limit") and err.message == "duplicate key (first on line 5)"
    err = error_of(scenario(tmp_path, engine="knobs: {max_num_batched_tokens: 8192, "
                                             "max_num_batched_tokens: 4096}"))
    assert where(err) == (11, "engines[0].knobs.max_num_batched_tokens")
    assert err.message == "duplicate key (first on line 11)"


def test_a_profile_that_cannot_be_read_is_named_at_its_key(tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, engine="knobs: {}\n    profile: /nonexistent/p.json"))
    assert where(err) == (12, "engines[0].profile")
    assert err.message.startswith("cell r: profile: /nonexistent/p.json: cannot read profile")


def test_the_engines_refusal_names_the_scenarios_key_not_its_own(tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, engine="knobs: {tensor_parallel_size: 3}"))
    assert where(err) == (11, "engines[0].knobs.tensor_parallel_size")
    assert err.message.startswith("cell r: tensor_parallel_size: 3 must divide the model's 32 "
                                  "attention heads")
    err = error_of(scenario(tmp_path, top="grid: {tensor_parallel_size: [1, 3]}\n"))
    assert where(err) == (8, "grid.tensor_parallel_size")


def test_a_max_model_len_the_trace_passes_is_named_at_its_key(tmp_path: Path) -> None:
    """Refused by the sweep once the trace is read, before anything is written: at the knob,
    not at the engine's name ("r:")."""
    path = scenario(tmp_path, engine="knobs: {max_model_len: 10}")
    with pytest.raises(ScenarioError) as info:
        sc.run_scenario(load_scenario(path), tmp_path / "out",
                        progress=sc.SweepProgress(1, stream=io.StringIO(), tty=False))
    assert where(info.value) == (11, "engines[0].knobs.max_model_len")
    assert info.value.message.startswith("cell r: 3 of 3 requests of its trace need more than "
                                         "its engine's max_model_len (10; ")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- text


@pytest.mark.parametrize(("line", "at", "message"), [
    ('question: ""', (2, "question"), "must be non-empty text"),
    ("question: '  '", (2, "question"), "must be non-empty text"),
    ("name: 2024-01-01", (1, "name"), "must be text, got a date (2024-01-01): quote it"),
    ("name: yes", (1, "name"), "must be text, got a boolean (true): quote it"),
    ("question: 42", (2, "question"), "must be text, got a number (42): quote it"),
    ("question:", (2, "question"), "must be text, got nothing (null)"),
])
def test_text_values_say_what_they_got(line: str, at: tuple[int, str], message: str,
                                       tmp_path: Path) -> None:
    path = scenario(tmp_path)
    key = line.split(":")[0]
    lines = path.read_text().splitlines()
    lines = [line if text.startswith(f"{key}:") else text for text in lines]
    path.write_text("\n".join(lines) + "\n")
    err = error_of(path)
    assert where(err) == at and err.message == message


def test_an_unknown_scenario_model_gets_a_suggestion(tmp_path: Path) -> None:
    path = scenario(tmp_path)
    path.write_text(path.read_text().replace("model: llama-3.1-8b", "model: llama-3.1-8B-x"))
    err = error_of(path)
    assert where(err) == (6, "model")
    assert "unknown model 'llama-3.1-8B-x' (did you mean 'llama-3.1-8b'?); known" in err.message


def test_an_exponent_yaml_reads_as_text_gets_the_spelling_it_takes(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e300`` as text: "must be a number, got text" left the user guessing."""
    err = error_of(scenario(tmp_path, top="load: {rates: [1, 2e3]}\n"))
    assert err.message == ("must be a number, got text ('2e3'): YAML reads '2e3' as text; "
                           "write it as 2.0e+03")


def test_trace_synthetic_on_a_file_scenario_says_where_synthetic_came_from(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`run S.yaml --trace synthetic` on a scenario written for a trace file: the error points
    at the scenario's line and says the synthetic trace came from --trace, with what the
    scenario's trace block must then give."""
    repo = Path(__file__).resolve().parents[2]
    assert main(["run", str(repo / "scenarios" / "engines-h100.yaml"), "--trace", "synthetic",
                 "--list"]) == 2
    err = capsys.readouterr().err
    assert "engines-h100.yaml:25: trace.num_requests: is required" in err
    assert "--trace synthetic replaced the scenario's trace file" in err
