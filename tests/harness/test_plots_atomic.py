"""A figure is replaced whole or not at all: a run stopped while its figures are drawn (its
report's processes killed) leaves the old PNG or none, never part of one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure

from harness.report import plots


def _draw(path: Path) -> Path | None:
    t_s = np.linspace(0.0, 10.0, 50)
    edges = plots.token_bin_edges(10.0)
    return plots.throughput_over_time(
        {"a": plots.TokenRate(plots.tokens_binned(t_s, np.ones_like(t_s), edges), 10.0)},
        edges, path)


def test_a_figure_is_written_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "throughput.png"
    assert _draw(path) == path
    assert path.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.png"]


def test_a_write_cut_short_leaves_the_old_figure(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "throughput.png"
    _draw(path)
    before = path.read_bytes()
    real = Figure.savefig

    def cut_short(self: Figure, fname: Any, **kwargs: Any) -> None:
        real(self, fname, **kwargs)
        Path(fname).write_bytes(Path(fname).read_bytes()[:100])  # half written, then...
        raise KeyboardInterrupt  # ... stopped

    monkeypatch.setattr(Figure, "savefig", cut_short)
    with pytest.raises(KeyboardInterrupt):
        _draw(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.png"]
