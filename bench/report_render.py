"""How long `batchlab report` takes with its figures drawn side by side, each in a process
forked from the renderer while it writes the text (``harness.report.side_by_side``), against
the same command drawing them one after another in its own process. The figures are the run
figures and, in a scenario of a batch-size sweep or of several loads
(``scenarios/batch-size.yaml``), the figures of its cells together.

Runs SCENARIO (default: scenarios/quickstart.yaml, simulated, no GPU) once into a temporary
folder with ``batchlab run``, then alternates, N times each (``--repeat``; best and median
of N printed, every time with ``--verbose``), in fresh processes:

1. baseline: ``batchlab report DIR`` in a process without ``os.fork``, so that the figures are
   drawn one after another in the renderer, as every report was before 2026-12-04;
2. ``batchlab report DIR`` as it runs now.

Each prints the command's wall time and the CPU time of it and every process it forked. The
script then checks that both wrote the same figures, byte for byte, and the same report.

    .venv/bin/python bench/report_render.py [SCENARIO] [--repeat N] [--verbose]

A scenario with live cells needs their engines; the quickstart's cells are all simulated.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arg_types import positive_int

REPO = Path(__file__).resolve().parents[1]
# `batchlab report DIR` with os.fork gone: harness.report.side_by_side then draws every
# figure in the renderer, one after another (the baseline)
_WITHOUT_FORK = ("import os, sys; del os.fork; from harness.cli import main; "
                 "sys.exit(main(['report', sys.argv[1]]))")
_AS_IT_RUNS = "import sys; from harness.cli import main; sys.exit(main(['report', sys.argv[1]]))"
WAYS = {"one after another": _WITHOUT_FORK, "side by side": _AS_IT_RUNS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", nargs="?", default=str(REPO / "scenarios" / "quickstart.yaml"),
                        help="scenario file (default: scenarios/quickstart.yaml)")
    parser.add_argument("--repeat", type=positive_int, default=5, metavar="N",
                        help="each way N times, alternating (5)")
    parser.add_argument("--verbose", action="store_true", help="print every time")
    args = parser.parse_args(argv)
    if not hasattr(os, "fork"):
        parser.error("needs os.fork: without it both ways are one after another")
    scenario = Path(args.scenario)
    if not scenario.is_file():
        parser.error(f"{scenario}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(scenario),
                               "--out", tmp], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:  # a scenario it cannot run: its one-line error names it
            parser.error(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                         else f"batchlab run exited with status {done.returncode}")
        (folder,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        copies = {way: Path(tmp) / f"report-{i}" for i, way in enumerate(WAYS)}
        for copy in copies.values():
            shutil.copytree(folder, copy)
        pngs = sorted(p.name for p in folder.glob("*.png"))
        print(f"scenario {scenario}: {len(list(folder.glob('*/summary.json')))} cells, "
              f"{len(pngs)} figures ({', '.join(pngs)})")
        times: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for _ in range(args.repeat):
            for way, code in WAYS.items():
                times[way].append(_report(code, copies[way]))
        base, new = WAYS
        print(f"batchlab report of the scenario's folder (best of {args.repeat}, median):")
        for way, runs in times.items():
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            print(f"    {way:<18} wall {min(walls):6.3f} s ({statistics.median(walls):.3f})"
                  f"   CPU {min(cpus):6.3f} s ({statistics.median(cpus):.3f})")
            if args.verbose:
                print(f"    {'':<18} wall " + " ".join(f"{w:.3f}" for w in walls)
                      + "   CPU " + " ".join(f"{c:.3f}" for c in cpus))
        best = {way: min(w for w, _ in runs) for way, runs in times.items()}
        median = {way: statistics.median(w for w, _ in runs) for way, runs in times.items()}
        print(f"    {new} against {base} (baseline): wall {best[base] / best[new]:.2f}x "
              f"faster (best), {median[base] / median[new]:.2f}x (median)")
        same = _same(copies[base], copies[new], pngs)
        print(f"the same figures and report both ways: {same}")
    return 0 if same else 1


def _report(code: str, folder: Path) -> tuple[float, float]:
    """``batchlab report folder`` in a fresh process: its wall time, and the CPU time of it
    and the processes it forked."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"batchlab report {folder} failed:\n{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _same(a: Path, b: Path, pngs: list[str]) -> bool:
    """The same PNGs byte for byte, and the same report but for the folder's own name."""
    if any((a / png).read_bytes() != (b / png).read_bytes() for png in pngs):
        return False
    return ((a / "report.md").read_text().replace(a.name, "DIR")
            == (b / "report.md").read_text().replace(b.name, "DIR"))


if __name__ == "__main__":
    sys.exit(main())
