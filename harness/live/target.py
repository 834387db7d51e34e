"""A live engine as a ``Target``: planned from the knobs, launched or attached, replayed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.live.run import run_live
from harness.target import RunOptions, TargetSpec

if TYPE_CHECKING:
    from harness.traces import Trace


@dataclass(frozen=True, slots=True)
class LiveTarget:
    """A live engine: planned from the knobs, launched or attached, replayed, torn down."""

    spec: TargetSpec

    def run(self, trace: Trace, out_dir: Path, options: RunOptions,
            *, dry_run: bool = False) -> dict[str, Any]:
        return run_live(self.spec, trace, out_dir, options, dry_run=dry_run)
