"""A live run's preemption count comes from the engine's counter; scrapes that failed after
its last answered one (an engine that died or hung) leave what it counted since unknown, and
the summary says so rather than give the count as whole."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness.live.rundir import with_engine_counters
from harness.live.telemetry import TELEMETRY_FILE, unanswered_tail


def _telemetry(out: Path, errors: list[str | None]) -> None:
    pq.write_table(pa.table({
        "t_s": pa.array([float(i) for i in range(len(errors))]),
        "num_preemptions": pa.array([None if e else 0.0 for e in errors], pa.float64()),
        "scrape_error": pa.array(errors, pa.string()),
    }), out / TELEMETRY_FILE)


def test_scrapes_that_failed_after_the_last_answer_are_said(tmp_path: Path) -> None:
    _telemetry(tmp_path, [None, None, "connection refused", "connection refused"])
    assert unanswered_tail(tmp_path) == (2, 1.0)
    summary = with_engine_counters({}, tmp_path)
    assert summary["num_preemptions"] == 0
    assert summary["preemptions_from"] == (
        "the engine's telemetry (its preemption counter) (up to its last answered scrape, at "
        "1.0 s; the 2 after it failed: preemptions after it are not counted)")


def test_a_run_whose_last_scrape_was_answered_says_nothing_more(tmp_path: Path) -> None:
    _telemetry(tmp_path, [None, "timed out", None])
    assert unanswered_tail(tmp_path) == (0, 2.0)
    assert with_engine_counters({}, tmp_path)["preemptions_from"] == \
        "the engine's telemetry (its preemption counter)"
    assert unanswered_tail(tmp_path / "none") == (0, None)
