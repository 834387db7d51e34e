"""The simulated reference engine as a ``Target``: the reference on its virtual clock."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.sim.run import run_simulation
from harness.target import RunOptions, TargetSpec

if TYPE_CHECKING:
    from adapters.reference import ReferenceConfig
    from harness.traces import Trace


@dataclass(frozen=True, slots=True)
class SimulatedTarget:
    """The reference engine on its virtual clock."""

    spec: TargetSpec

    def config(self) -> ReferenceConfig:
        """The one mapping from the spec's knobs to the reference (unset: its defaults)."""
        from adapters.reference import ReferenceConfig

        return ReferenceConfig.from_knobs(self.spec.knobs, self.spec.reference,
                                          model=self.spec.model, gpu=self.spec.gpu,
                                          profile=self.spec.profile)

    def run(self, trace: Trace, out_dir: Path, options: RunOptions) -> dict[str, Any]:
        config = self.config()
        return run_simulation(trace, config, out_dir, slo=options.slo,
                              progress=options.progress, command=options.command,
                              knobs=config.effective_knobs(),
                              write_report=options.write_report,
                              closed_loop=options.closed_loop, early_stop=options.early_stop,
                              overwrite=options.overwrite,
                              reporter=options.report_process)
