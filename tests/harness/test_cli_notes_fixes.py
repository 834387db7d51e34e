"""What the command line says about its input: the trace notes that ``simulate`` and
``capacity`` print next to their figures, ``costmodel``'s refusal of a context no request of
``simulate`` reaches, and where a YAML syntax error began."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.scenario._yaml import compose
from harness.scenario.schema import ScenarioError

EXCERPT = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"
NUM_ROWS = 40  # of the excerpt, copied: enough to drop some, quick to simulate


def _copy_excerpt(tmp_path: Path, bad_line: int | None = None) -> Path:
    """The excerpt's header and first ``NUM_ROWS`` rows; ``bad_line``: that line's prompt
    length replaced by text (a malformed row)."""
    lines = EXCERPT.read_text().splitlines()[: NUM_ROWS + 1]
    if bad_line is not None:
        stamp, _, output = lines[bad_line - 1].split(",")
        lines[bad_line - 1] = f"{stamp},abc,{output}"
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _num_longer_than(path: Path, max_len: int) -> int:
    rows = [line.split(",") for line in path.read_text().splitlines()[1:]]
    return sum(int(prompt) + int(output) > max_len for _, prompt, output in rows)


def _simulate(path: Path, out: Path, *extra: str) -> None:
    assert main(["simulate", "--trace", str(path), "--no-report", "--out", str(out),
                 *extra]) == 0


def _line_after_headline(out: str) -> str:
    lines = out.splitlines()
    headline = next(i for i, line in enumerate(lines) if " requests completed in " in line)
    return lines[headline + 1]


# ---------------------------------------------------------------- simulate


def test_simulate_says_how_many_requests_it_dropped_as_too_long(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy_excerpt(tmp_path)
    num_dropped = _num_longer_than(path, 1024)
    assert num_dropped > 0
    _simulate(path, tmp_path / "run", "--max-model-len", "1024", "--on-too-long", "drop")
    out = capsys.readouterr().out
    assert f"{NUM_ROWS - num_dropped}/{NUM_ROWS - num_dropped} requests completed" in out
    assert _line_after_headline(out) == (
        f"note: dropped {num_dropped} requests longer than max_model_len 1024")


def test_simulate_says_how_many_requests_it_clipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy_excerpt(tmp_path)
    num_clipped = _num_longer_than(path, 1024)
    _simulate(path, tmp_path / "run", "--max-model-len", "1024", "--on-too-long", "clip")
    assert _line_after_headline(capsys.readouterr().out) == (
        f"note: clipped {num_clipped} requests to max_model_len 1024 (the prompt truncated "
        "from the left first)")


def test_simulate_says_which_malformed_row_it_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy_excerpt(tmp_path, bad_line=3)
    _simulate(path, tmp_path / "run", "--skip-bad-rows")
    out = capsys.readouterr().out
    assert f"{NUM_ROWS - 1}/{NUM_ROWS - 1} requests completed" in out
    assert _line_after_headline(out).startswith(
        f"note: skipped 1 malformed row of {path} (--skip-bad-rows): line 3, field "
        "'ContextTokens': ")


def test_simulate_prints_no_note_when_the_trace_is_read_as_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy_excerpt(tmp_path)
    # nothing is longer than the engine's own length: dropping changes nothing
    _simulate(path, tmp_path / "run", "--on-too-long", "drop")
    assert "note:" not in capsys.readouterr().out


def test_a_closed_loop_says_what_was_dropped_but_not_the_arrivals_it_does_not_use(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy_excerpt(tmp_path)
    num_dropped = _num_longer_than(path, 1024)
    _simulate(path, tmp_path / "run", "--mode", "closed", "--concurrency", "4",
              "--time-scale", "2", "--max-model-len", "1024", "--on-too-long", "drop")
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: dropped {num_dropped} requests longer than max_model_len 1024"]


# ---------------------------------------------------------------- capacity


def test_capacity_says_how_many_requests_it_dropped_under_its_headline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy_excerpt(tmp_path)
    num_dropped = _num_longer_than(path, 1024)
    assert main(["capacity", "--trace", str(path), "--max-model-len", "1024",
                 "--on-too-long", "drop", "--slo", "tpot_s=1", "--max-probes", "2",
                 "--out", str(tmp_path / "cap")]) in (0, 1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("capacity search (rate, ")
    # each probe rescales the arrivals to its rate: that note of the first probe is not said
    notes = [line for line in lines if line.startswith("note: ")]
    assert lines[1] == notes[0]
    assert notes == [f"note: dropped {num_dropped} requests longer than max_model_len 1024"]


# ---------------------------------------------------------------- costmodel

LLAMA_8B_MAX_MODEL_LEN = 131072  # llama-3.1-8b's max_position_embeddings


def test_costmodel_refuses_a_context_longer_than_simulate_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costmodel", "--context-len", "200000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(
        f"batchlab costmodel: error: --context-len: expected at most "
        f"{LLAMA_8B_MAX_MODEL_LEN - 2}, got 200000: llama-3.1-8b's max_model_len is "
        f"{LLAMA_8B_MAX_MODEL_LEN} tokens (prompt + output)")


def test_costmodel_takes_the_longest_context_of_a_request_and_no_more(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a request of max_model_len tokens holds KV for at most max_model_len - 1 of them (its
    # last token is never fed back); its last decode step adds one to the context it holds
    longest = LLAMA_8B_MAX_MODEL_LEN - 2
    assert main(["costmodel", "--context-len", str(longest)]) == 0
    assert f"decode with {longest} tokens of context" in capsys.readouterr().out
    assert main(["costmodel", "--context-len", str(longest + 1)]) == 2
    assert f"got {longest + 1}:" in capsys.readouterr().err


def test_costmodel_takes_the_limit_from_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    # mistral-7b's max_position_embeddings: 32768, where llama-3.1-8b's context still fits
    assert main(["costmodel", "--model", "mistral-7b", "--context-len", "32767"]) == 2
    assert ("--context-len: expected at most 32766, got 32767: mistral-7b's max_model_len is "
            "32768 tokens") in capsys.readouterr().err


# ---------------------------------------------------------------- YAML syntax errors


def _yaml_error(text: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        compose(text, "s.yaml")
    return str(caught.value)


def test_a_yaml_error_says_where_the_broken_construct_started() -> None:
    text = "name: t\nengines: [reference]\ngpu: [h100-sxm\nmodel: llama-3.1-8b\n"
    assert _yaml_error(text) == ("s.yaml:4: invalid YAML: expected ',' or ']', but got ':' "
                                 "(in the flow sequence that starts on line 3)")


def test_a_yaml_error_on_the_line_where_its_construct_started_says_the_line_once() -> None:
    assert _yaml_error("a: [b, c: d: e]\n") == (
        "s.yaml:1: invalid YAML: expected ',' or ']', but got ':'")


def test_a_yaml_error_without_a_context_is_unchanged() -> None:
    assert _yaml_error("a: 1\n  b: 2\n") == "s.yaml:2: invalid YAML: mapping values are not " \
        "allowed here"
