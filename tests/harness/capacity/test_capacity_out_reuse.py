"""A capacity --out holds one search: another one there (other engine, knobs, trace, SLO or
target, or another scenario's) is refused, naming it, unless --overwrite; the same search again
starts over, or goes on with --resume (harness.capacity.run.other_search, check_same_search).

Issue case: a second `capacity` with another --limit, --max-num-seqs and --slo into the --out
of a first one ran with exit 0 and no word: the first search's probe folders were deleted and
its search.json replaced, where `simulate`, `replay` and `validate` refuse another run's
folder without --overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness.capacity.settings as capacity_settings
from harness.cli import main as cli_main
from harness.runfolder import LOCK_FILE

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
FIRST = ["capacity", "--trace", TRACE, "--limit", "60", "--max-num-seqs", "64", "--start", "2",
         "--max-probes", "2", "--slo", "ttft_s=0.5,tpot_s=0.03"]
OTHER = ["capacity", "--trace", TRACE, "--limit", "40", "--max-num-seqs", "32", "--start", "2",
         "--max-probes", "2", "--slo", "ttft_s=0.5"]
SCENARIO = """\
name: tiny
question: which cap serves more?
trace: {path: azure_conv_excerpt.csv, limit: 40}
model: llama-3.1-8b
gpu: h100-sxm
slo: {ttft_s: 0.5}
engines:
  - {name: fcfs, engine: reference, knobs: {policy: fcfs}}
grid:
  max_num_seqs: [4, 8]
"""


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (the lock aside)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_search_with_other_settings_is_refused_unless_overwrite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c"
    assert cli_main([*FIRST, "--out", str(out)]) == 0
    before = _files(out)
    capsys.readouterr()
    assert cli_main([*OTHER, "--out", str(out)]) == 2
    said = _err(capsys)
    assert said.startswith(f"batchlab capacity: error: --out {out}: holds another capacity "
                           "search (reference-capacity of setting reference, changed: engine "
                           "or knobs: --max-num-seqs 64 then, 32 now")
    assert "SLO: {'ttft_s': 0.5, 'tpot_s': 0.03} then, {'ttft_s': 0.5} now" in said
    assert said.endswith("); pass --overwrite to replace it, or choose another --out")
    assert _files(out) == before  # nothing written, nothing deleted
    # a resume of it is no way round: it says what starting over takes
    assert cli_main([*OTHER, "--out", str(out), "--resume"]) == 2
    assert _err(capsys).endswith("drop --resume and pass --overwrite to start over, or choose "
                                 "another --out")
    assert _files(out) == before
    # asked to: replaced, nothing of the earlier search left beside it
    assert cli_main([*OTHER, "--out", str(out), "--overwrite"]) == 0
    search = json.loads((out / "reference" / "search.json").read_text())
    assert search["slo"] == {"ttft_s": 0.5}
    probes = {p["label"] for p in search["probes"]}
    assert {p.name for p in (out / "reference").iterdir() if p.is_dir()} == probes
    # and the new search is now the folder's own
    assert cli_main([*OTHER, "--out", str(out)]) == 0


def test_the_same_search_again_starts_over_or_resumes_as_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "c"
    assert cli_main([*FIRST, "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli_main([*FIRST, "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().err.count("(resumed)") == 2
    assert cli_main([*FIRST, "--out", str(out)]) == 0
    assert "started over: removed 2 probe folder(s)" in capsys.readouterr().err
    # the same command under another batchlab version is the same search: started over
    monkeypatch.setattr(capacity_settings, "batchlab_version", lambda: "0.0.0-other")
    assert cli_main([*FIRST, "--out", str(out)]) == 0
    assert "started over: removed 2 probe folder(s)" in capsys.readouterr().err


def test_a_scenario_search_and_a_search_without_one_are_other_searches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "c"
    assert cli_main([*FIRST, "--out", str(out)]) == 0
    before = _files(out)
    capsys.readouterr()
    search = ["capacity", str(scenario), "--only", "*-8", "--start", "2", "--max-probes", "2",
              "--out", str(out)]
    assert cli_main(search) == 2
    assert _err(capsys) == (f"batchlab capacity: error: --out {out}: holds another capacity "
                            "search (reference-capacity of setting reference; this is "
                            "tiny-capacity); pass --overwrite to replace it, or choose "
                            "another --out")
    assert _files(out) == before
    assert cli_main([*search, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["fcfs__max_num_seqs-8"]
    rows = json.loads((out / "capacity.json").read_text())["settings"]
    assert [r["setting"] for r in rows] == ["fcfs__max_num_seqs-8"]
    # the scenario's own folder: another of its settings is searched beside the first, which
    # stays listed, and the scenario edited since is still its search
    assert cli_main([*search[:3], "*-4", *search[4:]]) == 0
    scenario.write_text(SCENARIO.replace("ttft_s: 0.5", "ttft_s: 0.4"))
    assert cli_main(search) == 0
    capsys.readouterr()
    # (the setting the edit changed and this search did not redo is left out, and said so)
    assert [r["setting"] for r in json.loads((out / "capacity.json").read_text())[
        "left_out"]] == ["fcfs__max_num_seqs-4"]
    # a search without the scenario is another search there
    assert cli_main([*FIRST, "--out", str(out)]) == 2
    assert _err(capsys).startswith(f"batchlab capacity: error: --out {out}: holds another "
                                   "capacity search (tiny-capacity of setting "
                                   "fcfs__max_num_seqs-8; this is reference-capacity)")


def test_overwrite_never_removes_what_batchlab_did_not_write(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "c"
    assert cli_main([*FIRST, "--out", str(out)]) == 0
    (out / "reference" / "notes.txt").write_text("mine\n")
    (out / "reference" / "rate-2" / "mine.csv").write_text("1,2\n")
    before = _files(out)
    capsys.readouterr()
    assert cli_main(["capacity", str(scenario), "--only", "*-8", "--max-probes", "2",
                     "--out", str(out), "--overwrite"]) == 2
    said = _err(capsys)
    assert said.startswith(f"batchlab capacity: error: setting folder {out / 'reference'}: "
                           "holds files batchlab did not write (notes.txt); move them")
    assert _files(out) == before
    (out / "reference" / "notes.txt").unlink()
    assert cli_main(["capacity", str(scenario), "--only", "*-8", "--max-probes", "2",
                     "--out", str(out), "--overwrite"]) == 2
    assert (f"probe folder {out / 'reference' / 'rate-2'}: holds files batchlab did not write "
            "(mine.csv)") in _err(capsys)
    assert (out / "reference" / "rate-2" / "mine.csv").is_file()
    assert (out / "reference" / "search.json").is_file()


def test_a_shipped_profile_refitted_since_leaves_the_same_search(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same command, with --profile, after a newer batchlab refitted that shipped profile:
    the same search, started over, not another one refused; a profile file of the user's own
    that changed is another search."""
    out = tmp_path / "c"
    command = [*FIRST, "--profile", "trtllm-h100-sxm", "--out", str(out)]
    assert cli_main(command) == 0
    path = out / "trtllm-h100-sxm" / "search.json"
    record = json.loads(path.read_text())
    made_from = record["made_from"]
    made_from["engine"]["cost_model"] = "trtllm-h100-sxm: fitted on published measurements, old"
    made_from["engine"]["cost_model_digest"] = "0123456789abcdef"
    made_from["files"] = {p: ("0" * 64 if p.endswith("trtllm-h100-sxm.json") else d)
                          for p, d in made_from["files"].items()}
    record["digest"] = "another"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert cli_main(command) == 0
    assert "started over: removed" in capsys.readouterr().err
    # the user's own profile, edited since: another search
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"memory_efficiency": 0.7, "device": "h100-sxm"}))
    mine = [*FIRST, "--profile", str(own), "--out", str(tmp_path / "d")]
    assert cli_main(mine) == 0
    own.write_text(json.dumps({"memory_efficiency": 0.6, "device": "h100-sxm"}))
    capsys.readouterr()
    assert cli_main(mine) == 2
    assert "holds another capacity search" in _err(capsys)


def test_overwrite_removes_an_empty_probe_folder_an_interrupt_left(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A probe interrupted between making its folder and writing its cell.json leaves an empty
    folder: it holds nothing of anyone's, and does not stop --overwrite."""
    out = tmp_path / "c"
    assert cli_main([*FIRST, "--profile", "trtllm-h100-sxm", "--out", str(out)]) == 0
    (out / "trtllm-h100-sxm" / "rate-99").mkdir()
    assert cli_main([*OTHER, "--out", str(out), "--overwrite"]) == 0
    assert not (out / "trtllm-h100-sxm").exists()
