"""Scenario files: schema errors that name file, line and key; cell expansion; shipped scenarios."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from adapters.base import Knobs
from harness.live.session import plan_for
from harness.scenario import (
    Cell,
    LoadPoint,
    ScenarioError,
    assign_priorities,
    expand,
    load_cell_trace,
    load_scenario,
    select,
)
from harness.scenario.cell import target_spec
from harness.traces.records import requests_digest

REPO = Path(__file__).resolve().parent.parent.parent
DATA = REPO / "tests" / "data"
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))

GOOD = """\
name: demo
question: Which is better?
trace:
  path: azure_conv_excerpt.csv
  limit: 20
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - name: static
    engine: reference
    knobs: {policy: static, max_model_len: 8192}
  - name: cont
    engine: reference
    knobs: {policy: fcfs}
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return info.value


# ---------------------------------------------------------------- schema errors


def test_committed_bad_scenario_names_file_line_key_and_suggests() -> None:
    path = DATA / "scenario_bad_key.yaml"
    err = error_of(path)
    assert (err.file, err.line, err.key) == (str(path), 9, "engines[0].knobs.max_num_seq")
    assert str(err).startswith(f"{path}:9: engines[0].knobs.max_num_seq: unknown key; "
                               "did you mean 'max_num_seqs'?")


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "baselin: static\n")
    err = error_of(path)
    assert err.line == 15 and err.key == "baselin"
    assert "did you mean 'baseline'?" in str(err)


def test_unknown_trace_option_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("  limit: 20", "  limt: 20"))
    err = error_of(path)
    assert (err.line, err.key) == (5, "trace.limt")
    assert "did you mean 'limit'?" in str(err)


def test_wrong_type_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("  limit: 20", "  limit: twenty"))
    err = error_of(path)
    assert (err.line, err.key) == (5, "trace.limit")
    assert "must be an integer, got text ('twenty')" in str(err)


def test_knob_of_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("{policy: fcfs}", "{policy: fcfs, max_num_seqs: many}"))
    err = error_of(path)
    assert (err.line, err.key) == (14, "engines[1].knobs.max_num_seqs")
    assert "must be a positive integer" in str(err)


def test_bad_choice_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("engine: reference\n    knobs: {policy: fcfs}",
                                        "engine: vlm\n    knobs: {policy: fcfs}"))
    err = error_of(path)
    assert (err.line, err.key) == (13, "engines[1].engine")
    assert "did you mean 'vllm'?" in str(err)


def test_bad_yaml_syntax_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("  limit: 20", "  limit: [20"))
    err = error_of(path)
    assert err.file == str(path)
    assert err.line is not None and 5 <= err.line <= 8
    assert "invalid YAML" in str(err)


def test_a_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    """It was a UnicodeDecodeError traceback, where a trace file's gets file:line."""
    path = tmp_path / "bad.yaml"
    path.write_bytes(GOOD.encode().replace(b"question:", b"question: \xff", 1))
    err = error_of(path)
    line = GOOD[:GOOD.index("question:")].count("\n") + 1
    assert (err.file, err.line) == (str(path), line)
    assert "not UTF-8 text (byte 0xff" in str(err)


def test_an_unset_traces_dir_in_a_trace_path_is_its_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$BATCHLAB_TRACES_DIR unset was left in the path as a folder named "$BATCHLAB_TRACES_DIR",
    where the command line's traces default to ../shared/traces."""
    import shutil

    import harness.traces.data as data

    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "harness" / "data" / "azure_conv_excerpt.csv", traces / "t.csv")
    monkeypatch.delenv("BATCHLAB_TRACES_DIR", raising=False)
    monkeypatch.setattr(data, "default_traces_dir", lambda: traces)
    for spelled in ("$BATCHLAB_TRACES_DIR/t.csv", "${BATCHLAB_TRACES_DIR}/t.csv"):
        scenario = load_scenario(write(tmp_path, GOOD.replace("azure_conv_excerpt.csv",
                                                              f'"{spelled}"')))
        assert scenario.trace.file == traces / "t.csv"


def test_an_unset_variable_in_a_trace_path_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_DIR", raising=False)
    err = error_of(write(tmp_path, GOOD.replace("azure_conv_excerpt.csv",
                                                '"$NO_SUCH_DIR/t.csv"')))
    assert (err.line, err.key) == (4, "trace.path")
    assert "$NO_SUCH_DIR, which is not set" in str(err)


def test_a_trace_rate_with_load_rates_is_refused(tmp_path: Path) -> None:
    """load.rates replaced it without a word (a trace time_scale with load.rates was refused)."""
    text = GOOD.replace("  limit: 20\n", "  limit: 20\n  rate: 3\n").replace(
        "model: llama", "load: {rates: [2, 4]}\nmodel: llama")
    err = error_of(write(tmp_path, text))
    assert (err.line, err.key) == (6, "trace.rate")
    assert "would never be used" in str(err)


def test_a_control_character_names_its_line(tmp_path: Path) -> None:
    """The YAML reader refuses a NUL as the loader is made, outside the parse that turned
    YAML errors into file:line: a traceback."""
    path = tmp_path / "nul.yaml"
    path.write_text(GOOD.replace("question:", "question: \x00", 1))
    err = error_of(path)
    assert err.line == GOOD[:GOOD.index("question:")].count("\n") + 1
    assert "invalid YAML" in str(err) and "#x0000" in str(err)


def test_missing_required_key(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("gpu: h100-sxm\n", ""))
    err = error_of(path)
    assert (err.line, err.key) == (1, "gpu")
    assert "is required" in str(err)


def test_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "model: other\n")
    err = error_of(path)
    assert (err.line, err.key) == (15, "model")
    assert "duplicate key (first on line 6)" in str(err)


def test_missing_trace_file_lists_bundled(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("azure_conv_excerpt.csv", "azure_conv_exerpt.csv"))
    err = error_of(path)
    assert (err.line, err.key) == (4, "trace.path")
    assert "did you mean 'azure_conv_excerpt.csv'?" in str(err)


def test_priority_shares_must_add_up(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + textwrap.dedent("""\
        priority_classes:
          - {name: a, share: 0.5, priority: 0}
          - {name: b, share: 0.4, priority: 1}
    """))
    err = error_of(path)
    assert (err.line, err.key) == (16, "priority_classes")
    assert "add up to 0.9" in str(err)


def test_grid_and_engine_knob_conflict(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "grid:\n  policy: [fcfs, priority]\n")
    err = error_of(path)
    assert err.key == "grid.policy" and "set it in one place" in str(err)


def test_engine_config_checked_before_running(tmp_path: Path) -> None:
    """A simulated cell the engine would refuse stops the sweep at load time."""
    path = write(tmp_path, GOOD.replace("{policy: fcfs}", "{policy: fcfs, chunked_prefill: false, "
                                                          "max_num_batched_tokens: 8192}"))
    err = error_of(path)
    # (left unset, the budget would be raised to max_model_len, as vLLM does)
    assert (err.line, err.key) == (14, "engines[1].knobs.max_num_batched_tokens")
    assert "cell cont: max_num_batched_tokens" in str(err) and "max_model_len" in str(err)


def test_concurrency_on_simulated_engines(tmp_path: Path) -> None:
    """Closed-loop users on the virtual clock: concurrency load points for simulated cells."""
    path = write(tmp_path, GOOD + "load:\n  concurrencies: [4, 8]\n")
    cells = load_scenario(path).cells()
    assert {c.load.label for c in cells} == {"conc-4", "conc-8"}


def test_live_only_option_on_reference(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    knobs: {policy: fcfs}",
                                        "    knobs: {policy: fcfs}\n    url: http://x"))
    err = error_of(path)
    assert (err.line, err.key) == (15, "engines[1].url")


def test_unknown_baseline_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "baseline: statc\n")
    err = error_of(path)
    assert err.key == "baseline" and "did you mean 'static'?" in str(err)


def test_empty_file(tmp_path: Path) -> None:
    assert "empty" in str(error_of(write(tmp_path, "")))


# ---------------------------------------------------------------- expansion


def test_cells_expand_engines_by_grid_by_load() -> None:
    scenario = load_scenario(DATA / "scenario_small.yaml")
    names = [c.name for c in scenario.cells()]
    assert names == ["static__max_num_seqs-4", "static__max_num_seqs-8",
                     "continuous__max_num_seqs-4", "continuous__max_num_seqs-8"]
    cell = scenario.cells()[3]
    assert cell.knobs.max_num_seqs == 8 and cell.knobs.policy == "fcfs"
    assert cell.grid == {"max_num_seqs": 8}
    assert scenario.baseline_cell() == "static__max_num_seqs-4"


def test_cell_names_with_loads_and_bools(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("knobs: {policy: fcfs}", "knobs: {policy: fcfs}\n")
                 .replace("    knobs: {policy: static, max_model_len: 8192}",
                          "    knobs: {policy: static, max_model_len: 8192,"
                          " max_num_batched_tokens: 8192}")
                 + "grid:\n  kv_cache_dtype: [bf16, fp8]\nload:\n  time_scales: [1, 0.5]\n")
    scenario = load_scenario(path)
    names = [c.name for c in scenario.cells()]
    assert len(names) == 8
    assert names[:2] == ["static__kv_cache_dtype-bf16__x1", "static__kv_cache_dtype-bf16__x0.5"]
    assert all(c.load.kind == "time_scale" for c in scenario.cells())
    assert names == [c.name for c in load_scenario(path).cells()]  # stable


def test_select_by_pattern() -> None:
    cells = load_scenario(DATA / "scenario_small.yaml").cells()
    assert [c.name for c in select(cells, "static*")] == [
        "static__max_num_seqs-4", "static__max_num_seqs-8"]
    assert len(select(cells, "continuous")) == 2  # engine name
    assert len(select(cells, "*-4,*-8")) == 4
    assert select(cells, None) == cells


def test_gpus_for_live_cells() -> None:
    live = Cell(name="v", engine=load_scenario(DATA / "scenario_small.yaml").engines[0],
                knobs=Knobs(tensor_parallel_size=2))
    assert live.gpus == 0  # simulated
    from dataclasses import replace
    live = replace(live, engine=replace(live.engine, engine="vllm", mode="live"))
    assert live.gpus == 2


def test_priority_classes_assigned_by_share() -> None:
    scenario = load_scenario(DATA / "scenario_small.yaml")
    trace = load_cell_trace(scenario, LoadPoint())
    prios = [r.priority for r in trace.requests]
    assert len(prios) == 40 and set(prios) == {0, 1}
    assert 4 <= prios.count(0) <= 18
    again = assign_priorities(trace, scenario.priority_classes, seed=99)
    # a trace that carries priorities keeps them, and says the classes were not drawn
    assert again.requests == trace.requests and again.digest == trace.digest
    assert again.notes == (*trace.notes, "the scenario's priority_classes were not drawn: "
                           "the requests' priorities are the trace's own (its priority column)")
    # the digest covers the priorities drawn: another seed, other requests, another digest
    plain = dataclasses.replace(trace, requests=tuple(
        dataclasses.replace(r, priority=None) for r in trace.requests))
    seeds = [assign_priorities(plain, scenario.priority_classes, seed=s) for s in (1, 2)]
    assert [r.priority for r in seeds[0].requests] != [r.priority for r in seeds[1].requests]
    assert seeds[0].digest == requests_digest(seeds[0].requests) != seeds[1].digest
    assert trace.digest == requests_digest(trace.requests)


def test_trace_mix_merges_by_arrival(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        name: mix
        question: q
        trace:
          path: azure_conv_excerpt.csv
          limit: 10
          priority: 1
          label: chat
          mix:
            - {path: mooncake_conversation_excerpt.jsonl, limit: 5, priority: 0, label: long,
               max_model_len: 32768, on_too_long: clip}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines: [{name: e, engine: reference}]
    """)
    scenario = load_scenario(path)
    trace = load_cell_trace(scenario, LoadPoint())
    assert len(trace.requests) == 15
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)
    assert sum(1 for r in trace.requests if r.request_id.startswith("m1-")) == 5
    assert {r.priority for r in trace.requests if r.request_id.startswith("m1-")} == {0}
    assert scenario.class_names() == {1: "chat", 0: "long"}
    assert " + " in trace.source


# ---------------------------------------------------------------- shipped scenarios


def test_scenarios_are_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"quickstart", "fcfs-vs-priority", "preemption", "chunked-prefill", "fp8",
            "batch-size", "engines-h100"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_is_valid_and_says_its_question(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# Question:"), "each scenario starts with the question it answers"
    scenario = load_scenario(path)
    cells = expand(scenario)
    assert cells and scenario.question
    assert any(c.engine.mode == "simulated" for c in cells), "runnable here on the reference"
    assert scenario.trace.path.is_relative_to(REPO / "harness" / "data"), "bundled excerpt"
    for part in scenario.trace.mix:
        assert part.path.is_relative_to(REPO / "harness" / "data")


def test_a_live_reference_cell_launches_with_its_profile_and_settings(tmp_path: Path) -> None:
    """A served reference cell predicts with the profile and KV settings its entry names, as
    the simulated one does (they used to reach only simulated cells)."""
    path = write(tmp_path, GOOD.replace(
        "    knobs: {policy: fcfs}",
        "    knobs: {policy: fcfs}\n    mode: live\n    profile: vllm-h100-sxm\n"
        "    num_gpu_blocks: 900"))
    cell = next(c for c in load_scenario(path).cells() if c.engine.name == "cont")
    spec = target_spec(cell, "llama-3.1-8b", "h100-sxm")
    assert spec.mode == "launch" and spec.profile == "vllm-h100-sxm"
    assert spec.reference.num_gpu_blocks == 900
    argv = plan_for(spec).argv
    assert argv[argv.index("--profile") + 1] == "vllm-h100-sxm"
    assert argv[argv.index("--num-gpu-blocks") + 1] == "900"


def test_a_profile_cell_keeps_the_profiles_block_size_unless_its_entry_sets_one(
        tmp_path: Path) -> None:
    """A scenario cell predicts as `simulate --profile` does: trtllm-h100-sxm's 32-token KV
    blocks, not a scenario default of 16 (its accuracy was measured with 32)."""
    from harness.scenario.cell import reference_config

    path = write(tmp_path, GOOD.replace(
        "    knobs: {policy: fcfs}", "    knobs: {policy: fcfs}\n    profile: trtllm-h100-sxm"))
    cell = next(c for c in load_scenario(path).cells() if c.engine.name == "cont")
    assert reference_config(cell, "llama-3.1-8b", "h100-sxm").block_size == 32
    path = write(tmp_path, GOOD.replace(
        "    knobs: {policy: fcfs}",
        "    knobs: {policy: fcfs}\n    profile: trtllm-h100-sxm\n    block_size: 16"))
    cell = next(c for c in load_scenario(path).cells() if c.engine.name == "cont")
    assert reference_config(cell, "llama-3.1-8b", "h100-sxm").block_size == 16


def test_a_trace_longer_than_its_engines_max_model_len_is_refused_on_its_line(
        tmp_path: Path) -> None:
    """The trace keeps (or clips to) 16,384 tokens but the engine takes 8,192: the requests
    between would be rejected in the run, whatever on_too_long says. Refused at load."""
    text = (DATA / "scenario_small.yaml").read_text().replace(
        "  limit: 40\n", "  limit: 40\n  max_model_len: 16384\n  on_too_long: drop\n").replace(
        "path: azure_conv_excerpt.csv", f"path: {REPO / 'harness/data/azure_conv_excerpt.csv'}")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"s.yaml:7: trace.max_model_len: 16384 passes cell "
                                            r"static__max_num_seqs-4's engine max_model_len "
                                            r"\(8192"):
        load_scenario(path)
    path.write_text(text.replace("max_model_len: 16384", "max_model_len: 8192"))
    assert load_scenario(path).trace.options["max_model_len"] == 8192


def test_an_engine_key_written_in_its_knobs_is_pointed_one_level_up(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    knobs: {policy: fcfs}",
                                        "    knobs: {policy: fcfs, profile: vllm-h100-sxm}"))
    with pytest.raises(ScenarioError, match=r"engines\[\d\]\.knobs\.profile: profile is a key "
                                            r"of the engine, not of its knobs: write it beside "
                                            r"knobs, as engines\[\d\]\.profile"):
        load_scenario(path)


def test_a_trace_path_that_is_a_folder_or_a_near_miss_says_so(tmp_path: Path) -> None:
    text = (DATA / "scenario_small.yaml").read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("path: azure_conv_excerpt.csv", f"path: {tmp_path}"))
    with pytest.raises(ScenarioError, match=r"trace.path: '.*' is a folder \(.*\), not a trace "
                                            r"file"):
        load_scenario(path)
    path.write_text(text.replace("path: azure_conv_excerpt.csv", "path: azure_conv_excrpt.csv"))
    with pytest.raises(ScenarioError, match=r"did you mean 'azure_conv_excerpt.csv'\? Bundled "
                                            r"excerpts: arxiv_lengths_excerpt.csv, ") as err:
        load_scenario(path)
    assert "README.md" not in str(err.value) and "LICENSES.md" not in str(err.value)


def test_a_scenarios_errors_name_its_keys_not_command_line_flags(tmp_path: Path) -> None:
    from harness.scenario._text import as_keys

    assert as_keys("raise --max-num-batched-tokens or use --chunked-prefill; x--y stays") == (
        "raise max_num_batched_tokens or use chunked_prefill; x--y stays")
    text = (DATA / "scenario_small.yaml").read_text().replace(
        "  limit: 40\n", "  limit: 40\n  max_model_len: 1024\n").replace(
        "max_model_len: 8192", "max_model_len: 1024").replace(
        "path: azure_conv_excerpt.csv", f"path: {REPO / 'harness/data/azure_conv_excerpt.csv'}")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    with pytest.raises(ScenarioError, match=r"on_too_long drop\|clip handles them") as err:
        load_cell_trace(scenario, scenario.cells()[0].load)
    assert "--" not in str(err.value).split("trace:", 1)[1]
