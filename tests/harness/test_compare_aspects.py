"""What ``batchlab compare`` holds fixed between two runs, beyond the knobs: defects a nightly
job would have passed or failed on for the wrong reason.

- two live closed loops at 4 and 32 users were both "trace timing": no load warning;
- replay client settings that change the load or the measurement (``--max-concurrency``,
  ``--protocol``, ``--timeout-s``) were never compared;
- a side whose client, not its engine, was the limit went unsaid;
- a run killed or interrupted before its summary was "not a run folder" (exit 2) on either
  side, where the docs say it is not compared (after: exit 1, before: exit 0);
- a regression of exactly the limit failed it (10.000000000000009% > 10%);
- two predictions with other cost-model coefficients under one profile path read the same;
- a GPU or configuration key one side never recorded read as a difference;
- and before a comparison, ``summarize`` of a truncated parquet file named no file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.compare import compare

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("base") / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "30", "--no-report",
                 "--out", str(run)]) == 0
    return run


def patched(base: Path, to: Path, *, manifest: dict[str, Any] | None = None,
            summary: dict[str, Any] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of ``base`` with fields of its manifest and summary replaced (None: removed)."""
    shutil.copytree(base, to)
    for name, fields in (("manifest.json", manifest), ("summary.json", summary)):
        if fields:
            data = json.loads((to / name).read_text())
            for key, value in fields.items():
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
            (to / name).write_text(json.dumps(data))
    for name in drop:
        (to / name).unlink()
    return to


def live(concurrency: int | None = None, **replay: Any) -> dict[str, Any]:
    """Manifest fields of a live replay (its client's settings) at the trace's timing, or a
    closed loop of ``concurrency`` users."""
    settings = {"mode": "closed" if concurrency else "open", "concurrency": concurrency,
                "max_concurrency": None, "protocol": "openai", "timeout_s": 600.0,
                "length_control": "vllm", "http_client": "lean", "prompt_salt": "", **replay}
    return {"replay": settings, "load": None, "kind": "live"}


def aspects(before: Path, after: Path) -> dict[str, str]:
    return {d.aspect: d.text for d in compare(before, after).differences}


def test_two_live_closed_loops_differ_in_load(base: Path, tmp_path: Path) -> None:
    four = patched(base, tmp_path / "c4", manifest=live(4))
    many = patched(base, tmp_path / "c32", manifest=live(32))
    assert aspects(four, many)["load"] == "different load (4 users -> 32 users)"


def test_client_settings_that_change_the_load_are_compared(base: Path, tmp_path: Path) -> None:
    a = patched(base, tmp_path / "a", manifest=live())
    b = patched(base, tmp_path / "b", manifest=live(max_concurrency=4, protocol="tgi",
                                                    timeout_s=2.0))
    said = aspects(a, b)["client"]
    assert said.startswith("different replay client settings: ")
    for part in ("max_concurrency none -> 4", "protocol openai -> tgi", "timeout_s 600.0 -> 2.0"):
        assert part in said
    c = patched(base, tmp_path / "c", manifest=live(prompt_salt="a1b2"))  # salts: not load
    assert "client" not in aspects(a, c)


def test_a_client_limited_side_is_said(base: Path, tmp_path: Path) -> None:
    summary = json.loads((base / "summary.json").read_text())
    lagged = patched(base, tmp_path / "lag", summary={
        "client_limited": True, "send_lag_s": {**summary["ttft_s"], "p99": 0.015}})
    assert aspects(base, lagged)["client_limited"] == (
        "after was client-limited (send lag p99 15 ms): its latencies include the client's "
        "own delay")


@pytest.mark.parametrize(("side", "code"), [("after", 1), ("before", 0)])
def test_a_run_killed_before_its_summary_is_not_compared(
        base: Path, tmp_path: Path, side: str, code: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    killed = patched(base, tmp_path / "killed",
                     manifest={"status": "interrupted", "error": "interrupted (SIGTERM)"},
                     drop=("summary.json", "requests.parquet", "chunks.parquet"))
    folders = [str(base), str(killed)] if side == "after" else [str(killed), str(base)]
    assert main(["compare", *folders, "--fail-if", "ttft_s.p90=10"]) == code
    printed = capsys.readouterr()
    assert "not a run folder" not in printed.err


def test_a_regression_of_exactly_the_limit_passes(base: Path, tmp_path: Path) -> None:
    summary = json.loads((base / "summary.json").read_text())
    one = patched(base, tmp_path / "one", summary={"ttft_s": {**summary["ttft_s"], "p90": 1.0}})
    more = patched(base, tmp_path / "more",
                   summary={"ttft_s": {**summary["ttft_s"], "p90": 1.1}})
    assert main(["compare", str(one), str(more), "--fail-if", "ttft_s.p90=10"]) == 0
    assert main(["compare", str(one), str(more), "--fail-if", "ttft_s.p90=9.99"]) == 1


def test_other_coefficients_under_one_profile_path_are_a_difference(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    runs = []
    for i, efficiency in enumerate((0.8, 0.5)):
        profile.write_text(json.dumps({"memory_efficiency": efficiency}))
        run = tmp_path / f"run{i}"
        assert main(["simulate", "--trace", str(EXCERPT), "--limit", "10", "--profile",
                     str(profile), "--no-report", "--out", str(run)]) == 0
        runs.append(run)
    assert "cost_model_digest" in aspects(*runs)["engine_config"]


def test_what_one_side_never_recorded_is_not_a_difference(base: Path, tmp_path: Path) -> None:
    manifest = json.loads((base / "manifest.json").read_text())
    config = dict(manifest["engine"]["config"])
    config.pop("cost_model_digest")
    unrecorded = patched(base, tmp_path / "older", manifest={
        "gpu": None, "engine": {**manifest["engine"], "config": config}})
    found = aspects(base, unrecorded)
    assert "gpu" not in found and "engine_config" not in found, found


def test_summarize_names_the_parquet_file_it_cannot_read(
        base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pyarrow's own message ("Parquet magic bytes not found in footer") named no file."""
    damaged = patched(base, tmp_path / "damaged")
    (damaged / "requests.parquet").write_bytes((base / "requests.parquet").read_bytes()[:100])
    assert main(["summarize", str(damaged)]) == 2
    assert (f"{damaged / 'requests.parquet'}: cannot be read as a parquet file"
            in capsys.readouterr().err)
