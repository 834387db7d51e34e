"""harness.columns builds the arrays pa.array would, without pa.array (which imports pandas)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness import columns
from harness.results import (
    RUN_ID_KEY,
    chunks_table,
    read_timelines,
    requests_table,
    write_parquet_atomic,
    write_timelines,
)
from harness.timeline import RequestTimeline

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("built", "expected"), [
    (lambda: columns.floats([1.5, float("nan"), -2.0]),
     lambda: pa.array([1.5, float("nan"), -2.0])),
    (lambda: columns.floats(np.arange(5, dtype=np.int64)),
     lambda: pa.array(np.arange(5, dtype=np.float64))),
    (lambda: columns.ints([3, None, 2**40, -1]),
     lambda: pa.array([3, None, 2**40, -1], pa.int64())),
    (lambda: columns.ints(np.array([7, 8], dtype=np.int32)), lambda: pa.array([7, 8], pa.int64())),
    (lambda: columns.ints([]), lambda: pa.array([], pa.int64())),
    (lambda: columns.strings(["a", None, "", "héllo", "x" * 300]),
     lambda: pa.array(["a", None, "", "héllo", "x" * 300], pa.string())),
    (lambda: columns.strings([]), lambda: pa.array([], pa.string())),
    (lambda: columns.bools([True, False, True] * 5), lambda: pa.array([True, False, True] * 5)),
])
def test_the_same_array_as_pa_array(built, expected) -> None:  # type: ignore[no-untyped-def]
    got, want = built(), expected()
    got.validate(full=True)
    assert got.type == want.type and got.null_count == want.null_count
    assert got.equals(want) or np.array_equal(  # NaN != NaN in equals
        got.to_numpy(zero_copy_only=False), want.to_numpy(zero_copy_only=False), equal_nan=True)


def _timelines() -> list[RequestTimeline]:
    return [
        RequestTimeline("a", 0.0, 8, 3, priority=1, sent_s=0.01, scheduled_s=0.0,
                        chunk_times_s=(0.5, 0.6, 0.7), chunk_num_tokens=(1, 1, 1),
                        finished_s=0.7, num_output_tokens=3, finish_reason="length"),
        RequestTimeline("b", 0.2, 9, 4, chunk_times_s=(0.9, 1.2), chunk_num_tokens=(1, 2),
                        finished_s=None, error_kind="stream_cut", error_message="cut"),
        RequestTimeline("c", 0.3, 10, 2),
    ]


@pytest.mark.parametrize("live", [False, True])
def test_requests_and_chunks_tables_keep_their_types_and_nulls(live: bool) -> None:
    timelines = _timelines()
    table = requests_table(timelines, live=live)
    table.validate(full=True)
    assert table.column("priority").to_pylist() == [1, None, None]
    assert table.column("error_kind").to_pylist() == [None, "stream_cut", None]
    assert table.schema.field("request_id").type == pa.string()
    assert np.isnan(table.column("finished_s").to_numpy()[1])
    if live:
        assert table.column("reached_target_length").type == pa.bool_()
        assert table.column("send_lag_s").to_pylist()[0] == pytest.approx(0.01)
    chunks = chunks_table(timelines)
    chunks.validate(full=True)
    assert chunks.column("request_id").to_pylist() == ["a", "a", "a", "b", "b"]
    assert chunks.column("chunk_index").to_pylist() == [0, 1, 2, 0, 1]
    assert chunks.column("num_tokens").to_pylist() == [1, 1, 1, 1, 2]


def test_a_dictionary_column_is_read_back_as_text_with_the_run_id(tmp_path: Path) -> None:
    """chunks.parquet's request ids are written as a dictionary, and read as plain text with
    the file's run id, as every other table of the folder."""
    timelines = _timelines()
    chunks = chunks_table(timelines)
    assert pa.types.is_dictionary(chunks.schema.field("request_id").type)
    write_parquet_atomic(chunks, tmp_path / "chunks.parquet", run_id="run-1")
    back = pq.read_table(tmp_path / "chunks.parquet")
    assert back.schema == pa.schema([("request_id", pa.string()), ("chunk_index", pa.int64()),
                                     ("t_s", pa.float64()), ("num_tokens", pa.int64())])
    assert back.schema.metadata == {RUN_ID_KEY: b"run-1"}
    assert back.column("request_id").to_pylist() == ["a", "a", "a", "b", "b"]
    assert back.drop_columns(["request_id"]).equals(chunks.drop_columns(["request_id"]))
    assert not list(tmp_path.glob("*.tmp"))
    write_parquet_atomic(chunks, tmp_path / "plain.parquet")  # no run id: no metadata
    assert pq.read_table(tmp_path / "plain.parquet").schema.metadata is None
    write_timelines(tmp_path / "run", timelines, live=False)
    again = read_timelines(tmp_path / "run")
    assert [(t.chunk_times_s, t.chunk_num_tokens) for t in again] == [
        (t.chunk_times_s, t.chunk_num_tokens) for t in timelines]


def test_statistics_are_written_for_numbers_not_for_text(tmp_path: Path) -> None:
    """Each row group's least and greatest value of every numeric column, for readers that
    skip row groups by them; none of a text column's (request IDs: of no use, and the cost of
    a third of a whole trace's chunks.parquet)."""
    write_parquet_atomic(chunks_table(_timelines()), tmp_path / "chunks.parquet")
    write_parquet_atomic(pa.table({"name": ["a", "b"]}), tmp_path / "text.parquet")
    stats = {}
    for name in ("chunks.parquet", "text.parquet"):
        group = pq.ParquetFile(tmp_path / name).metadata.row_group(0)
        stats |= {group.column(i).path_in_schema: group.column(i).statistics
                  for i in range(group.num_columns)}
    assert {c: s is not None for c, s in stats.items()} == {
        "request_id": False, "chunk_index": True, "t_s": True, "num_tokens": True,
        "name": False}
    assert (stats["chunk_index"].min, stats["chunk_index"].max) == (0, 2)


# what a simulated run never needs: pandas (pa.array, to_numpy), the live client and its
# engines (httpx), the scenario runner and the report (drawn by a child process)
_NOT_FOR_A_SIMULATION = ("pandas", "pyarrow.compute", "httpx", "matplotlib", "harness.live",
                         "harness.scenario", "harness.report", "adapters.catalog")


def test_a_simulated_run_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    """Every module a command imports is paid for before or after its simulation; the
    fell-behind warning printed after a run once loaded the scenario runner, and with it the
    live client (a quarter of a second)."""
    code = ("import sys\n"
            "from harness.cli import main\n"
            f"code = main(['simulate', '--trace', 'synthetic', '--num-requests', '50', "
            f"'--rate', '20', '--prompt-tokens', '32', '--output-tokens', '8', "
            f"'--out', {str(tmp_path / 'run')!r}])\n"
            f"print(sorted(m for m in sys.modules if m.startswith({_NOT_FOR_A_SIMULATION!r})))\n"
            "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("column", [
    pa.array([1.5, float("nan"), -2.0]),
    pa.array([1.5, None, -2.0]),
    pa.array([3, None, 2**40, -1], pa.int64()),
    pa.array([7, 8, 9], pa.int32()),
    pa.array([True, False, None, True] * 5),
    pa.array([True, False, True] * 7).slice(3, 10),  # an offset into the bitmap
    pa.array([1.0, 2.0, None, 4.0, 5.0]).slice(1, 3),  # an offset into data and validity
    pa.chunked_array([pa.array([1, 2]), pa.array([None, 4])], pa.int64()),
    pa.chunked_array([], pa.float64()),
    pa.array([], pa.int64()),
    pa.array([None, None]),  # type null: a column nobody ever filled
], ids=repr)
def test_numbers_reads_what_to_numpy_reads(column: pa.Array | pa.ChunkedArray) -> None:
    got = columns.numbers(column)
    expected = column.to_numpy(zero_copy_only=False)
    if expected.dtype == object:  # nulls only: None, which the readers treat as NaN
        expected = np.asarray(expected, dtype=np.float64)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_numbers_refuses_text() -> None:
    with pytest.raises(TypeError, match="not a numeric column"):
        columns.numbers(pa.array(["a"]))


def test_the_report_of_a_run_does_not_import_pandas(tmp_path: Path) -> None:
    """The report's process (its warm-up, then the report) reads its files with
    ``pq.ParquetFile`` and ``numbers``, and writes with ``columns``: neither ``pq.read_table``
    (pyarrow.dataset), ``to_numpy`` nor ``pa.array`` loads pandas into it."""
    run = tmp_path / "run"
    code = ("import sys\n"
            "from harness.cli import main\n"
            f"assert main(['simulate', '--trace', 'synthetic', '--num-requests', '50', "
            f"'--rate', '20', '--prompt-tokens', '32', '--output-tokens', '8', "
            f"'--out', {str(run)!r}, '--no-report']) == 0\n"
            "from pathlib import Path\n"
            "from harness.report.render import render_run_report, warm_up\n"
            f"warm_up(Path({str(tmp_path)!r}))\n"  # what the report's child process does
            f"render_run_report(Path({str(run)!r}))\n"
            "print('pandas' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (run / "latency_cdf.png").exists() and (run / "report.md").exists()
    assert done.stdout.strip().splitlines()[-1] == "False"
