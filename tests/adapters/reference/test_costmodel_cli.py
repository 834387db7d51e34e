"""`batchlab costmodel`: the seed's table from the command line."""

from __future__ import annotations

import pytest

from harness.cli import main


def test_costmodel_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costmodel", "--model", "llama-3.1-8b", "--gpu", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b on h100-sxm" in out and "TPOT ms" in out
    rows = [f for f in (line.split() for line in out.splitlines())
            if len(f) == 8 and f[0].isdigit()]
    assert [int(r[0]) for r in rows][:5] == [1, 4, 16, 64, 256]
    assert rows[0][5] == "memory"
    assert 5.0 < float(rows[0][2]) < 8.0  # ms: ~16 GB / 3.35 TB/s plus efficiency and overhead


def test_costmodel_bad_input_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costmodel", "--model", "llama-9", "--gpu", "h100-sxm"]) == 2
    assert "known models" in capsys.readouterr().err
    assert main(["costmodel", "--model", "llama-3.1-70b", "--gpu", "h100-sxm"]) == 2
    assert "Raise --tp" in capsys.readouterr().err
