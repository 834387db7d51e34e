"""Fixtures shared by the harness tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plot functions save, in order (each still written to its file)."""
    from harness.report import plots

    figures: list[Figure] = []
    real_save = plots._save

    def keep(fig: Figure, path: Path, note: str | None = None) -> Path:
        figures.append(fig)
        return real_save(fig, path, note)

    monkeypatch.setattr(plots, "_save", keep)
    return figures
