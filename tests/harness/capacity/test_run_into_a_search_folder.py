"""A command that claims a run folder (``simulate``, ``replay``: harness.runfolder.claim_run_dir)
names a scenario sweep's or capacity search's folder as what it is, even with --overwrite, and
deletes nothing there.

Issue case: `simulate --out DIR`, DIR the folder `batchlab run scenarios/quickstart.yaml` wrote,
said "holds files batchlab did not write (continuous/, continuous-chunked/, scenario.json,
...)": batchlab wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.runfolder import (
    LOCK_FILE,
    RunDirError,
    RunIdentity,
    claim_run_dir,
    release_run_dir,
)

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
SCENARIO = """\
name: quick
question: does a run keep out of a sweep's folder?
trace: {path: azure_conv_excerpt.csv, limit: 10}
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - {name: continuous, engine: reference}
  - {name: continuous-chunked, engine: reference, knobs: {chunked_prefill: true}}
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sweeps")
    scenario = root / "quick.yaml"
    scenario.write_text(SCENARIO)
    assert cli_main(["run", str(scenario), "--out", str(root / "runs")]) == 0
    assert cli_main(["capacity", "--trace", TRACE, "--limit", "40", "--start", "2",
                     "--max-probes", "2", "--slo", "ttft_s=0.5", "--out",
                     str(root / "cap")]) == 0
    return {"scenario": root / "runs" / "quick", "capacity": root / "cap",
            "setting": root / "cap" / "reference"}


@pytest.mark.parametrize(("folder", "what"), [
    ("scenario", "the folder of scenario quick (scenario.json)"),
    ("capacity", "the folder of a capacity search (capacity.json)"),
    ("setting", "the folder of one setting of a capacity search (search.json)"),
])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_simulate_names_a_sweeps_folder_as_what_it_is(
        folders: dict[str, Path], folder: str, what: str, overwrite: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    out = folders[folder]
    before = _files(out)
    capsys.readouterr()
    assert cli_main(["simulate", "--trace", TRACE, "--limit", "10", "--out", str(out),
                     *overwrite]) == 2
    assert capsys.readouterr().err.strip() == (
        f"batchlab simulate: error: --out {out}: is {what}, not one run's: choose another "
        "folder")
    assert _files(out) == before


def test_a_replay_claim_names_a_scenario_folder_too(folders: dict[str, Path]) -> None:
    out = folders["scenario"]
    before = _files(out)
    identity = RunIdentity("live", "c" * 64, target="http://127.0.0.1:1")
    with pytest.raises(RunDirError, match=r"is the folder of scenario quick \(scenario\.json\), "
                                          "not one run's: choose another folder"):
        claim_run_dir(out, identity, overwrite=True)
    assert _files(out) == before
    assert not (out / LOCK_FILE).exists()


def test_a_cell_of_a_sweep_is_still_claimed_by_its_sweep(folders: dict[str, Path]) -> None:
    cell = folders["scenario"] / "continuous"
    identity = RunIdentity("simulated", "d" * 64, engine="reference")
    claim_run_dir(cell, identity, overwrite=True)  # what `run --only continuous` does
    release_run_dir(cell)
    assert (cell / "cell.json").is_file()
