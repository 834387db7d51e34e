"""``batchlab replay`` flags a review found unchecked: each is refused with exit status 2 and one
line naming it, before anything is sent or a run folder is made.

Issue cases: ``--target http://127.0.0.1:99999`` ended in ``OverflowError: connect(): port must
be 0-65535`` and ``--target 'http://[::1'`` in ``httpx.InvalidURL`` (exit 1, tracebacks);
``--engine-env``, ``--metric-map``, ``--port`` or ``--telemetry-interval-s`` without
``--engine`` were dropped without a word; ``--workers 1000 --limit 5`` ran for minutes and
``--workers 30 --limit 3`` started 27 processes with nothing to send.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import harness.live.workers as workers
from harness.cli import main
from harness.live.config import ReplayConfig
from harness.metrics import summarize
from harness.traces import Trace, TraceRequest

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a refusal must come before anything is sent


def replay_argv(out: Path, *flags: str) -> list[str]:
    return ["replay", "--model", "m", "--trace", str(EXCERPT), "--limit", "2",
            "--out", str(out), *flags]


# ---------------------------------------------------------------- A. server URLs


BAD_URLS = [
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://127.0.0.1:abc", "its port is not a number"),
    ("http://127.0.0.1:0", "port 0"),
    ("ftp://127.0.0.1:8000", "scheme 'ftp'"),
    ("127.0.0.1:8000", "no http:// or https://"),
    ("http://:8000", "no host"),
    ("http://127.0.0.1:8000/?k=v", "no ?query"),
    ("http://exa mple:8000", "whitespace"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
@pytest.mark.parametrize("how", [("--target",), ("--engine", "openai", "--url")])
def test_a_malformed_server_url_is_refused_naming_its_flag(
        url: str, why: str, how: tuple[str, ...], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(replay_argv(out, *how, url)) == 2
    err = capsys.readouterr().err
    shown = url.split("?")[0] + "?***" if "?" in url else url  # a query may hold a key
    assert f"{how[-1]}: {shown!r}: not an http(s)://host[:port] URL (" in err and why in err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_refused_url_repeats_no_credential(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(replay_argv(tmp_path / "run", "--target",
                            "http://user:s3cret@127.0.0.1:99999/v?key=t0ken")) == 2
    err = capsys.readouterr().err
    assert "'http://***@127.0.0.1:99999/v?***'" in err
    assert "s3cret" not in err and "t0ken" not in err


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_replay_config_refuses_a_malformed_url_as_a_value_error(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"target_url: .*not an http") as info:
        ReplayConfig(target_url=url).validate()
    assert why in str(info.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://h.example/prefix/",
                                 "http://[::1]:8000", "http://localhost"])
def test_a_well_formed_url_is_accepted(url: str) -> None:
    ReplayConfig(target_url=url).validate()


# ---------------------------------------------------------------- B. engine-only options


@pytest.mark.parametrize(("flags", "named"), [
    (["--engine-env", "FOO"], "--engine-env"),
    (["--metric-map", "garbage"], "--metric-map"),
    (["--port", "5"], "--port"),
    (["--telemetry-interval-s", "0"], "--telemetry-interval-s"),
    (["--ready-timeout-s", "5"], "--ready-timeout-s"),
    (["--model-path", "/models/x"], "--model-path"),
    (["--engine-executable", "/usr/bin/vllm"], "--engine-executable"),
    (["--container-runtime", "docker"], "--container-runtime"),
    (["--gpu", "h200"], "--gpu"),
    (["--no-prefix-caching"], "--no-prefix-caching"),
    (["--tp", "2", "--extra-arg=--enforce-eager"], "--tensor-parallel-size, --extra-arg"),
    (["--dry-run"], "--dry-run"),
])
def test_an_engine_option_without_engine_is_refused(
        flags: list[str], named: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(replay_argv(out, "--target", NOWHERE, *flags)) == 2
    assert f"error: {named}: only with --engine NAME" in capsys.readouterr().err
    assert not out.exists()


def test_every_uniform_knob_counts_as_an_engine_option() -> None:
    """The refusal reads the parser's groups by title: a renamed group must not let the knobs
    through unchecked."""
    from adapters.knobs import UNIFORM
    from harness.cli.live import _engine_only_options

    flags = {flag for option_strings, _, _ in _engine_only_options() for flag in option_strings}
    assert {s.flag for s in UNIFORM if s.name != "max_model_len"} <= flags
    assert {"--engine-env", "--metric-map", "--port", "--telemetry-interval-s", "--gpu"} <= flags


def test_max_model_len_is_a_trace_option_without_an_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-model-len`` clips the trace: not an engine option, never refused as one."""
    import harness.cli.live as cli_live

    def refuse_all_else(_url: str) -> None:
        raise SystemExit(7)  # reached the server probe: nothing was refused

    monkeypatch.setattr(cli_live, "_who_answers", refuse_all_else)
    with pytest.raises(SystemExit, match="7"):
        main(replay_argv(tmp_path / "run", "--target", NOWHERE, "--max-model-len", "4096"))


# ---------------------------------------------------------------- E. --workers


@pytest.mark.parametrize("num", ["0", "-1", "1000"])
def test_a_worker_count_out_of_bounds_is_refused(
        num: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "max_num_workers", lambda: 8)
    out = tmp_path / "run"
    assert main(replay_argv(out, "--target", NOWHERE, "--workers", num)) == 2
    err = capsys.readouterr().err
    assert "error: --workers: " in err and "Traceback" not in err
    if num == "1000":
        assert "1000 is more than 8 (4 per CPU of the 2 this process may use)" in err
    assert not out.exists()


def test_the_bound_is_four_workers_per_usable_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    assert workers.max_num_workers() == 12
    workers.check_num_workers(12)
    with pytest.raises(ValueError, match="workers: 13 is more than 12"):
        workers.check_num_workers(13)


def test_no_more_workers_start_than_requests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "max_num_workers", lambda: 64)
    started: list[int] = []

    def replay_workers(_trace: Trace, _config: ReplayConfig, _out: Path, *, num_workers: int,
                       **_kw: Any) -> dict[str, Any]:
        started.append(num_workers)
        return summarize([])

    monkeypatch.setattr(workers, "replay_workers", replay_workers)
    import harness.cli.live as cli_live

    monkeypatch.setattr(cli_live, "_who_answers", lambda _url: None)
    monkeypatch.setattr(cli_live, "server_gone", lambda *_a: None)
    assert main(replay_argv(tmp_path / "run", "--target", NOWHERE, "--workers", "30")) == 0
    assert started == [2]
    err = capsys.readouterr().err
    assert "note: --workers 30: the trace has 2 requests, so 2 workers start" in err


def test_replay_workers_itself_starts_no_more_workers_than_requests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def fake(*args: Any, num_workers: int, **_kw: Any) -> dict[str, Any]:
        configs = args[4]  # (trace, config, out_dir, run_id, configs)
        seen.extend([num_workers, len(configs)])
        return {}

    monkeypatch.setattr(workers, "max_num_workers", lambda: 64)
    monkeypatch.setattr(workers, "_replay_workers", fake)
    trace = Trace(tuple(TraceRequest(f"r{i}", 0.0, 8, 8) for i in range(3)), source="test",
                  format="test", digest="d" * 64)
    workers.replay_workers(trace, ReplayConfig(target_url=NOWHERE), tmp_path / "run",
                           num_workers=30)
    assert seen == [3, 3]


def test_a_scenario_engine_url_no_client_could_reach_is_refused_at_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Named by its file, line and key before any cell runs, as replay refuses --target."""
    repo = Path(__file__).resolve().parents[3]
    scenario = tmp_path / "u.yaml"
    scenario.write_text(
        "name: u\nquestion: q\n"
        f"trace:\n  path: {repo / 'harness' / 'data' / 'azure_conv_excerpt.csv'}\n  limit: 10\n"
        "model: llama-3.1-8b\ngpu: h100-sxm\n"
        "engines:\n  - name: v\n    engine: vllm\n    url: http://127.0.0.1:99999\n")
    assert main(["run", str(scenario), "--list"]) == 2
    err = capsys.readouterr().err
    assert "u.yaml:11: engines[0].url: 'http://127.0.0.1:99999': not an http(s)://host[:port] " \
           "URL" in err


def test_calibrate_refuses_a_malformed_url_as_replay_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--url", "http://[::1", "--model", "x",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "--url: 'http://[::1': not an http(s)://host[:port] URL" in err
    assert "Traceback" not in err


def test_calibrate_refuses_a_profile_path_that_is_its_work_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out X.calibration is the default work folder's path: the whole workload ran, then the
    profile could not be written ("X.calibration.tmp: Is a directory") and the fit was lost."""
    assert main(["calibrate", "--url", "http://127.0.0.1:9", "--model", "x",
                 "--out", str(tmp_path / "p.calibration")]) == 2
    err = capsys.readouterr().err
    assert "is the work folder the measurements go to" in err
    assert not (tmp_path / "p.calibration").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_engine_url_where_nothing_listens_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not "give --model": nothing answered at all. With --model, the wait for /health is
    --ready-timeout-s when shorter than the attach wait, and an attached run has no server
    logs of ours to point at."""
    url = f"http://127.0.0.1:{_free_port()}"
    trace = ["--trace", "synthetic", "--num-requests", "2", "--rate", "10",
             "--prompt-tokens", "8", "--output-tokens", "2"]
    assert main(["replay", "--engine", "reference", "--url", url, *trace,
                 "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"--engine reference --url {url}: no server answers there" in err
    assert "give --model" not in err
    assert main(["replay", "--engine", "reference", "--url", url, "--model", "m",
                 "--ready-timeout-s", "1", *trace, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"no ready server at {url} after 1 s" in err
    assert "server logs" not in err


def test_calibrate_replaces_an_earlier_profile_and_its_run_folders_only_when_asked(
        tmp_path: Path) -> None:
    """It overwrote a profile of another device without a word, and left an earlier
    calibration's phase folders beside the new ones as if measured with them."""
    from harness.cli.calibration import check_profile_out
    from harness.cli.common import UserError

    excerpt = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"
    out, work = tmp_path / "p.json", tmp_path / "p.calibration"
    check_profile_out(out, work)  # nothing there yet
    assert main(["simulate", "--trace", str(excerpt), "--limit", "2", "--no-report",
                 "--out", str(work / "decode-c16")]) == 0
    out.write_text("{}")
    with pytest.raises(UserError, match=r"there is a profile at .*p.json and an earlier "
                                        r"calibration's run folders in .*; pass --overwrite"):
        check_profile_out(out, work)
    check_profile_out(out, work, dry_run=True)  # measures nothing: removes nothing
    assert (work / "decode-c16").exists()
    check_profile_out(out, work, overwrite=True)
    assert not (work / "decode-c16").exists() and out.exists()  # replaced once written
