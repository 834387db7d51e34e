"""Two things ``batchlab compare`` and ``batchlab summarize`` left for the reader to find out:

- compare printed why a regression may not be one (its "not comparable" warnings) after the
  table and the verdict, and said a knob change twice: max_num_seqs 64 -> 32, then the KV
  blocks that follow from it (the fp32 logits of max_num_seqs sequences are reserved with the
  activations, ``CostModel.kv_budget``) as a "different engine configuration";
- summarize of a scenario cell left the scenario's report.md stale without a word, and of a
  scenario's folder failed with "no records.jsonl or requests.parquet" without saying what
  the folder is or which folders to summarize instead.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.compare import compare

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
SCENARIO = f"""\
name: nightly
question: q
trace: {{path: {EXCERPT}, limit: 20, time_scale: 0.35}}
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - name: continuous
    engine: reference
    knobs: {{policy: fcfs, max_num_seqs: 64, chunked_prefill: false,
             max_model_len: 8192, max_num_batched_tokens: 8192}}
"""


def run_scenario(root: Path, folder: str, *, seqs: int, blocks: int | None = None) -> Path:
    """The scenario with ``max_num_seqs: seqs`` (and ``num_gpu_blocks: blocks``) into
    ``root/folder``; its scenario folder."""
    path = root / f"{folder}.yaml"
    text = SCENARIO.replace("max_num_seqs: 64", f"max_num_seqs: {seqs}")
    path.write_text(text if blocks is None else text.replace(
        "engine: reference", f"engine: reference\n    num_gpu_blocks: {blocks}"))
    assert main(["run", str(path), "--out", str(root / folder)]) == 0
    return root / folder / "nightly"


def simulate(out: Path, *extra: str, monkeypatch: pytest.MonkeyPatch | None = None) -> Path:
    """A run of 10 requests into ``out``; with ``monkeypatch``, recorded as typed (the
    manifest's ``command`` is ``sys.argv``)."""
    argv = ["simulate", "--trace", str(EXCERPT), "--limit", "10", "--model", "llama-3.1-8b",
            "--gpu", "h100-sxm", *extra, "--no-report", "--out", str(out)]
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "argv", ["batchlab", *argv])
    assert main(argv) == 0
    return out


def num_gpu_blocks(run: Path) -> int:
    return int(json.loads((run / "manifest.json").read_text())["engine"]["config"]
               ["num_gpu_blocks"])


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two nights of one scenario, the second with max_num_seqs 64 -> 32."""
    root = tmp_path_factory.mktemp("nights")
    return run_scenario(root, "a", seqs=64), run_scenario(root, "b", seqs=32)


# ---------------------------------------------------------------- compare: warnings first


def test_warnings_come_after_the_folders_and_before_the_table_and_verdict(
        nights: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    both = io.StringIO()  # stdout and stderr as one log shows them
    monkeypatch.setattr(sys, "stdout", both)
    monkeypatch.setattr(sys, "stderr", both)
    main(["compare", str(nights[0]), str(nights[1]), "--fail-if", "ttft_s.p90=10"])
    lines = both.getvalue().splitlines()
    assert lines[:3] == [
        f"before: {nights[0]}", f"after:  {nights[1]}",
        "warning: not comparable as a regression test: different knobs: max_num_seqs 64 -> 32: "
        "continuous"]
    table = next(i for i, line in enumerate(lines) if line.startswith("cell  "))
    verdict = next(i for i, line in enumerate(lines) if line.startswith("checks: "))
    assert 3 < table < verdict
    assert not any(line.startswith("warning:") for line in lines[3:])


def test_warnings_keep_their_place_in_a_log_of_both_streams(nights: tuple[Path, Path]) -> None:
    """CI pipes both streams into one log: stdout is block-buffered there, so what comes
    before the warnings is flushed before them."""
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "compare", str(nights[0]), str(nights[1]),
         "--fail-if", "ttft_s.p90=10"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    lines = done.stdout.splitlines()
    assert lines[0] == f"before: {nights[0]}"
    assert lines[2].startswith("warning: not comparable as a regression test: different knobs")
    assert lines[-1].startswith("checks: ")


# ---------------------------------------------------------------- compare: derived KV blocks


def test_kv_blocks_that_follow_from_a_knob_change_are_not_a_second_warning(
        nights: tuple[Path, Path]) -> None:
    before, after = (n / "continuous" for n in nights)
    # 32 fewer sequences' fp32 logits reserved: 4 B x 32 x 128,256 vocab, 8 blocks of 2 MiB
    assert num_gpu_blocks(after) - num_gpu_blocks(before) == 8
    found = {d.aspect: d.text for d in compare(*nights).differences}
    assert found == {"knobs": "different knobs: max_num_seqs 64 -> 32"}


def test_kv_blocks_given_by_hand_are_said_beside_the_knob_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given, the block count follows from no knob: both changes are said, whether given in
    the scenario (``num_gpu_blocks:``) or on simulate's command line."""
    nights = (run_scenario(tmp_path, "a", seqs=64, blocks=3000),
              run_scenario(tmp_path, "b", seqs=32, blocks=4000))
    runs = (simulate(tmp_path / "s1", "--max-num-seqs", "64", "--num-gpu-blocks", "3000",
                     monkeypatch=monkeypatch),
            simulate(tmp_path / "s2", "--max-num-seqs", "32", "--num-gpu-blocks=4000",
                     monkeypatch=monkeypatch))
    for before, after in (nights, runs):
        found = {d.aspect: d.text for d in compare(before, after).differences}
        assert found == {"knobs": "different knobs: max_num_seqs 64 -> 32",
                         "engine_config": "different engine configuration: "
                                          "num_gpu_blocks 3000 -> 4000"}, (before, found)


def test_kv_blocks_no_listed_change_explains_are_said(tmp_path: Path) -> None:
    """A knob the block count does not follow from (preemption) explains none of its
    change."""
    before = simulate(tmp_path / "before")
    after = tmp_path / "after"
    shutil.copytree(before, after)
    manifest = json.loads((after / "manifest.json").read_text())
    manifest["knobs"]["preemption"] = "swap"
    manifest["engine"]["config"]["preemption"] = "swap"
    manifest["engine"]["config"]["num_gpu_blocks"] += 5
    (after / "manifest.json").write_text(json.dumps(manifest))
    blocks = num_gpu_blocks(before)
    found = {d.aspect: d.text for d in compare(before, after).differences}
    assert found["engine_config"] == (
        f"different engine configuration: num_gpu_blocks {blocks} -> {blocks + 5}")


# ---------------------------------------------------------------- summarize in a scenario


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quickstart")
    assert main(["run", str(REPO / "scenarios" / "quickstart.yaml"), "--out", str(out)]) == 0
    return out / "quickstart"


def test_summarize_of_a_cell_says_the_scenario_report_was_not_updated(
        quickstart: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = (quickstart / "report.md").read_text()
    capsys.readouterr()
    assert main(["summarize", str(quickstart / "continuous"), "--slo", "ttft_s=1"]) == 0
    out = capsys.readouterr().out
    assert (f"the scenario's report ({quickstart / 'report.md'}) was not updated: "
            f"`batchlab report {quickstart}` renders it again from its cells' summaries"
            in out.splitlines())
    assert (quickstart / "report.md").read_text() == report  # as said


def test_summarize_of_a_scenario_folder_names_it_and_its_cells(
        quickstart: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["summarize", str(quickstart)]) == 2
    err = capsys.readouterr().err
    assert (f"{quickstart}: the folder of scenario quickstart (scenario.json), not a run "
            "folder: summarize one of its cells instead, e.g. "
            f"{quickstart / 'continuous'}, {quickstart / 'continuous-chunked'}, "
            f"{quickstart / 'static'}") in err
    assert "no records.jsonl" not in err
