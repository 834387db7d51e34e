"""``--resume`` checks what is on disk: a done cell whose files were deleted, truncated or
changed is run again (and the progress line says why); an intact one is kept."""

from __future__ import annotations

import io
import json
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness import scenario as sc

SCENARIO = """\
name: tiny
question: Does resume check the files?
trace:
  path: azure_conv_excerpt.csv
  limit: 6
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - name: a
    engine: reference
    knobs: {max_num_seqs: 4}
  - name: b
    engine: reference
    knobs: {max_num_seqs: 8}
"""


class Counting:
    """The real cell runner, counting the cells it runs."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, job: sc.CellJob, out_dir: Path, progress: sc.ProgressFn
                 ) -> Mapping[str, Any]:
        self.calls.append(job.cell.name)
        return sc.run_cell(job, out_dir, progress)


def sweep(tmp_path: Path, *, resume: bool) -> tuple[Counting, str, sc.SweepResult]:
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    runner = Counting()
    stream = io.StringIO()
    result = sc.run_scenario(sc.load_scenario(path), tmp_path / "out", resume=resume,
                             runner=runner, write_report=False,
                             progress=sc.SweepProgress(2, stream=stream, tty=False))
    return runner, stream.getvalue(), result


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    runner, _, result = sweep(tmp_path, resume=False)
    assert runner.calls == ["a", "b"]
    assert [o.state for o in result.outcomes] == ["done", "done"]
    return tmp_path / "out" / "tiny"


def test_done_status_records_a_digest_of_every_file(finished: Path) -> None:
    status = sc.read_status(finished / "a")
    files = status["files"]
    assert {"requests.parquet", "chunks.parquet", "steps.parquet", "summary.json",
            "manifest.json", "cell.json"} <= set(files)
    assert all(len(digest) == 64 for digest in files.values())


def test_resume_keeps_intact_cells(tmp_path: Path, finished: Path) -> None:
    runner, log, result = sweep(tmp_path, resume=True)
    assert runner.calls == []
    assert [o.state for o in result.outcomes] == ["skipped", "skipped"]
    assert "running it again" not in log


def test_resume_reruns_a_cell_whose_requests_parquet_was_deleted(
    tmp_path: Path, finished: Path
) -> None:
    (finished / "a" / "requests.parquet").unlink()
    runner, log, result = sweep(tmp_path, resume=True)
    assert runner.calls == ["a"]
    assert [o.state for o in result.outcomes] == ["done", "skipped"]
    assert "a: finished earlier, but requests.parquet is missing: running it again" in log
    assert pq.read_metadata(finished / "a" / "requests.parquet").num_rows == 6


def test_resume_reruns_a_cell_whose_summary_was_truncated(
    tmp_path: Path, finished: Path
) -> None:
    summary = finished / "b" / "summary.json"
    summary.write_bytes(summary.read_bytes()[:40])
    runner, log, _ = sweep(tmp_path, resume=True)
    assert runner.calls == ["b"]
    assert "b: finished earlier, but summary.json does not parse" in log
    assert json.loads(summary.read_text())["num_requests"] == 6


def test_resume_reruns_a_cell_whose_file_changed(tmp_path: Path, finished: Path) -> None:
    # Still valid parquet, but not what the cell wrote: half of its rows.
    path = finished / "a" / "chunks.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(0, table.num_rows // 2), path)
    runner, log, _ = sweep(tmp_path, resume=True)
    assert runner.calls == ["a"]
    assert "chunks.parquet changed since the cell finished (its sha256 differs)" in log


def test_a_status_without_digests_is_checked_for_its_files(
    tmp_path: Path, finished: Path
) -> None:
    # status.json from before digests were recorded: the required files must still be there.
    status_path = finished / "a" / "status.json"
    status = json.loads(status_path.read_text())
    del status["files"]
    status_path.write_text(json.dumps(status))
    (finished / "a" / "manifest.json").unlink()
    runner, log, _ = sweep(tmp_path, resume=True)
    assert runner.calls == ["a"]
    assert "manifest.json is missing" in log


def test_a_trace_rewritten_in_place_runs_every_cell_again(tmp_path: Path) -> None:
    """The same path, other bytes: the cells' results came from the old file, and resuming
    must not serve them as the new one's."""
    from harness.traces import DATA_DIR

    trace = tmp_path / "t.csv"
    trace.write_text((DATA_DIR / "azure_conv_excerpt.csv").read_text())
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent(SCENARIO).replace("azure_conv_excerpt.csv", str(trace)))

    def run(resume: bool) -> list[str]:
        runner = Counting()
        sc.run_scenario(sc.load_scenario(path), tmp_path / "out", resume=resume,
                        runner=runner, write_report=False,
                        progress=sc.SweepProgress(2, stream=io.StringIO(), tty=False))
        return runner.calls

    assert run(False) == ["a", "b"]
    assert run(True) == []
    lines = trace.read_text().splitlines()
    head, rows = lines[0], lines[1:]
    trace.write_text("\n".join([head, *(r.rsplit(",", 1)[0] + ",7" for r in rows)]) + "\n")
    assert run(True) == ["a", "b"]


def test_a_cell_summarized_again_under_another_slo_is_kept(tmp_path: Path,
                                                         finished: Path) -> None:
    """`batchlab summarize CELL --slo ...` rewrites summary.json: batchlab's own rewrite, which
    --resume keeps, where an edit by anything else is run again."""
    from harness.cli import main

    assert main(["summarize", str(finished / "a"), "--slo", "ttft_s=0.5"]) == 0
    assert json.loads((finished / "a" / "summary.json").read_text())["slo"] == {"ttft_s": 0.5}
    runner, log, _ = sweep(tmp_path, resume=True)
    assert runner.calls == [] and "running it again" not in log
    (finished / "b" / "summary.json").write_text(
        (finished / "b" / "summary.json").read_text().replace('"num_requests"',
                                                              '"num_requests" '))
    runner, log, _ = sweep(tmp_path, resume=True)
    assert runner.calls == ["b"]
