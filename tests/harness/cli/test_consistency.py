"""The command line speaks one knob vocabulary: same flags everywhere, no abbreviations,
unset knobs never refused, and errors that never echo a value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from adapters.catalog import make_adapter
from adapters.knobs import REFERENCE, UNIFORM, Knobs
from harness.cli import build_parser, main

KNOB_COMMANDS = ("simulate", "serve", "replay", "calibrate", "validate")
GPU_COMMANDS = (*KNOB_COMMANDS, "costmodel")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser, _ = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(p: argparse.ArgumentParser) -> dict[str, str]:
    return {flag: a.dest for a in p._actions for flag in a.option_strings}


@pytest.mark.parametrize("command", KNOB_COMMANDS)
def test_every_knob_has_the_same_flag_and_dest(command: str) -> None:
    options = _options(_subparsers()[command])
    for spec in UNIFORM:
        if spec.name == "extra_args" and command == "simulate":
            continue  # nothing is launched
        if command == "serve" and spec.name == "extra_args":
            continue
        assert options.get(spec.flag) == spec.name, (command, spec.flag)
    assert options["--tp"] == options["--tensor-parallel-size"] == "tensor_parallel_size"


@pytest.mark.parametrize("command", GPU_COMMANDS)
def test_gpu_is_spelled_gpu_everywhere(command: str) -> None:
    options = _options(_subparsers()[command])
    assert options["--gpu"] == "gpu"
    assert "--device" not in options


@pytest.mark.parametrize("command", ("simulate", "serve"))
def test_reference_section_flags(command: str) -> None:
    options = _options(_subparsers()[command])
    for spec in REFERENCE:
        assert options[spec.flag] == spec.name


def test_no_subcommand_allows_abbreviations() -> None:
    parser, _ = build_parser()
    assert parser.allow_abbrev is False
    for name, sub in _subparsers().items():
        assert sub.allow_abbrev is False, name


@pytest.mark.parametrize("argv", [
    ["simulate", "--gpu-mem", "0.5"],
    ["simulate", "--max-num", "8"],
    ["replay", "--pro", "openai"],
    ["calibrate", "--model", "m", "--out", "p.json", "--gpu-memory", "0.5"],
])
def test_abbreviations_fail(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_a_near_miss_is_refused_with_the_flag_it_may_mean(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["capacity", "--trace", "synthetic", "--max-num-seq", "8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --max-num-seq\n--max-num-seq: did you mean --max-num-seqs?" \
        in err
    assert "8" not in err.split("error:")[1]  # values are never echoed


def test_a_stray_value_is_counted_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", "synthetic", "--chunked-prefill", "s3cret"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: 1 value not shown: a word where none was expected" in err
    assert "s3cret" not in err


def test_a_stray_path_is_named_with_where_a_trace_goes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`batchlab trace info FILE` (no --trace) was told "1 value not shown: a flag that takes
    no value given one?", which hid the path and guessed the wrong slip."""
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(SystemExit) as exc:
        main(["trace", "info", str(trace), "s3cret"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (f"unrecognized arguments: {trace}: a path where none was expected (a trace is "
            "given as --trace FILE); 1 value not shown") in err
    assert "s3cret" not in err  # a word that is no path is still not shown


def test_gpu_is_never_read_as_gpu_memory_utilization() -> None:
    parser, _ = build_parser()
    args = parser.parse_args(["calibrate", "--engine", "vllm", "--url", "http://x",
                              "--model", "m", "--gpu", "h100-sxm", "--out", "p.json"])
    assert args.gpu == "h100-sxm" and args.gpu_memory_utilization is None


@pytest.mark.parametrize("argv", [
    ["replay", "--api-key", "sk-SECRET-VALUE", "--trace", "x"],
    ["replay", "--api-key=sk-SECRET-VALUE", "--trace", "x"],
    ["simulate", "--rate", "sk-SECRET-VALUE"],
    ["simulate", "--policy", "sk-SECRET-VALUE"],
])
def test_errors_never_echo_an_option_value(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    captured = capsys.readouterr()
    assert "SECRET" not in captured.err + captured.out


@pytest.mark.parametrize("engine", ("vllm", "tgi", "trtllm", "reference"))
def test_unset_knobs_are_never_refused(engine: str) -> None:
    adapter = make_adapter(engine, model="m", port=8000)
    plan = adapter.plan(Knobs(given=frozenset()))
    for mapped in plan.mapping:
        assert mapped.status in ("default", "applied"), (engine, mapped)


@pytest.mark.parametrize("engine", ("vllm", "tgi", "trtllm", "reference"))
@pytest.mark.parametrize("spec", [s for s in UNIFORM if s.kind == "choice"],
                         ids=lambda s: s.name)
def test_a_default_knob_never_causes_a_refusal(engine: str, spec: object) -> None:
    """Giving one knob never makes another, unset one refuse: only the given value can."""
    from adapters.knobs import KnobError, KnobSpec

    assert isinstance(spec, KnobSpec)
    adapter = make_adapter(engine, model="m", port=8000)
    for value in spec.choices:
        knobs = Knobs.from_mapping({spec.name: value})
        try:
            plan = adapter.plan(knobs)
        except KnobError as exc:
            assert f"{spec.name}={value!r}" in str(exc)
            assert str(exc).count("=") == 1 or "; " not in str(exc)
            continue
        for mapped in plan.mapping:
            if mapped.knob != spec.name:
                assert mapped.status in ("default", "applied"), (engine, mapped)


def test_trtllm_static_dry_run_is_not_refused_for_an_unset_preemption(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--engine", "trtllm", "--launch", "--model", "m", "--policy",
                 "static", "--dry-run", "--trace", "synthetic", "--num-requests", "2",
                 "--rate", "1", "--prompt-tokens", "8", "--output-tokens", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "STATIC_BATCH" in out


def test_engine_options_without_an_engine_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--target", "http://127.0.0.1:9", "--dry-run", "--max-num-seqs",
                 "4", "--trace", "synthetic", "--num-requests", "2", "--rate", "1",
                 "--prompt-tokens", "8", "--output-tokens", "4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--dry-run" in err and "--max-num-seqs" in err


def test_target_and_url_must_agree(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--engine", "vllm", "--target", "http://127.0.0.1:9", "--url",
                 "http://127.0.0.1:10", "--model", "m", "--trace", "synthetic",
                 "--num-requests", "2", "--rate", "1", "--prompt-tokens", "8",
                 "--output-tokens", "4"])
    assert code == 2
    assert "different servers" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "usage"), [
    (["costmodel", "--max-model-len", "4096"], "usage: batchlab costmodel"),
    (["simulate", "--polcy", "fcfs"], "usage: batchlab simulate"),
    (["trace", "info", "--bogus"], "usage: batchlab trace info"),
])
def test_an_unknown_option_is_answered_with_its_commands_usage(
        argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Not the top level's `usage: batchlab [-h] COMMAND ...`: the command's own, and its
    name in the error line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert f"{usage.removeprefix('usage: ')}: error: unrecognized arguments: {argv[-2]}" in err \
        or f"{usage.removeprefix('usage: ')}: error: unrecognized arguments: {argv[-1]}" in err
