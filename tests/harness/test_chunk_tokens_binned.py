"""The throughput figure's tokens per slice of time, read from ``chunks.parquet`` a batch of
rows at a time (``harness.report.runs``): exactly what binning all of a run's chunks at once
gives, its end from the file's statistics or, without them, from the file; bad input left out
or said."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness import columns
from harness.report import plots, runs
from harness.results import write_parquet_atomic


def _chunks(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    t_s = np.sort(rng.uniform(5.0, 905.0, n))
    return t_s, rng.integers(1, 5, n)


def _write(path: Path, t_s: np.ndarray, tokens: np.ndarray, **kwargs: object) -> Path:
    table = columns.table({"t_s": columns.floats(t_s), "num_tokens": columns.ints(tokens)})
    if kwargs:
        pq.write_table(table, path, **kwargs)  # type: ignore[arg-type]
    else:
        write_parquet_atomic(table, path)
    return path


@pytest.mark.parametrize("statistics", [True, False])
def test_batches_bin_exactly_as_the_whole_run(tmp_path: Path, statistics: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    t_s, tokens = _chunks(rng, 5000)
    path = _write(tmp_path / "chunks.parquet", t_s, tokens,
                  **({} if statistics else {"write_statistics": False, "row_group_size": 1200}))
    meta = pq.ParquetFile(path).metadata
    assert (meta.row_group(0).column(0).statistics is not None) == statistics
    monkeypatch.setattr(runs, "CHUNK_BATCH_ROWS", 333)  # many batches, across row groups
    origin = 4.25
    last = runs.last_chunk_s(path)
    assert last == t_s.max()
    edges = plots.token_bin_edges(last - origin)
    binned = runs.chunk_tokens_binned(path, origin, edges)
    assert binned is not None
    assert np.array_equal(binned, plots.tokens_binned(t_s - origin, tokens, edges))
    assert binned.sum() == tokens.sum()


def test_a_file_it_cannot_read_is_left_out(tmp_path: Path) -> None:
    edges = plots.token_bin_edges(10.0)
    missing = tmp_path / "missing.parquet"
    truncated = tmp_path / "truncated.parquet"
    rng = np.random.default_rng(1)
    truncated.write_bytes(_write(tmp_path / "whole.parquet", *_chunks(rng, 50)).read_bytes()
                          [:-40])
    no_tokens = tmp_path / "no_tokens.parquet"
    write_parquet_atomic(columns.table({"t_s": columns.floats([1.0, 2.0])}), no_tokens)
    empty = _write(tmp_path / "empty.parquet", np.empty(0), np.empty(0, dtype=np.int64))
    for path in (missing, truncated, no_tokens):
        assert runs.last_chunk_s(path) is None
        assert runs.chunk_tokens_binned(path, 0.0, edges) is None
    assert runs.last_chunk_s(empty) is None  # no chunks: no line


def test_a_column_of_other_values_is_an_error_naming_file_and_column(tmp_path: Path) -> None:
    for statistics in (True, False):  # text's statistics are no instants either
        path = tmp_path / f"chunks-{statistics}.parquet"
        pq.write_table(pa.table({"t_s": ["a", "b"], "num_tokens": [1, 1]}), path,
                       write_statistics=statistics)
        with pytest.raises(ValueError, match=rf"chunks-{statistics}\.parquet: column t_s: "
                                             "not a numeric column"):
            runs.last_chunk_s(path)
        with pytest.raises(ValueError, match=rf"chunks-{statistics}\.parquet: column t_s"):
            runs.chunk_tokens_binned(path, 0.0, plots.token_bin_edges(1.0))
