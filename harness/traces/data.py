"""Where trace files live: the excerpts bundled in ``harness/data/`` and the full public traces
of ``$BATCHLAB_TRACES_DIR``."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TRACES_DIR_ENV = "BATCHLAB_TRACES_DIR"


def shared_traces_dir() -> Path | None:
    """The full public traces (``$BATCHLAB_TRACES_DIR``, else ``../shared/traces`` next to the
    repository), or None where that folder does not exist."""
    configured = os.environ.get(TRACES_DIR_ENV)
    path = Path(configured) if configured else default_traces_dir()
    return path if path.is_dir() else None


def default_traces_dir() -> Path:
    """Where the full public traces are looked for when ``$BATCHLAB_TRACES_DIR`` is not set:
    ``../shared/traces`` next to the repository."""
    return REPO_ROOT.parent / "shared" / "traces"
