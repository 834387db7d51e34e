"""``batchlab compare``: two nights of one scenario, paired by cell, judged by direction."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from adapters.reference import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness import scenario as sc
from harness.cli import main
from harness.compare import (
    FORMAT,
    METRICS,
    VERSION,
    Change,
    CompareError,
    Pair,
    change_of,
    compare,
    metric_named,
)
from harness.prediction import prediction_text
from harness.report import collect

# Two engines, 40 requests of the bundled Azure excerpt at 10x its rate: enough queueing that
# max_num_seqs 4 instead of 64 shows in every latency and in throughput.
SCENARIO = """\
name: nightly
question: Did tonight's build get slower?
trace:
  path: azure_conv_excerpt.csv
  limit: {limit}
  time_scale: 0.1
model: llama-3.1-8b
gpu: h100-sxm
slo: {{ttft_s: 1.0, tpot_s: 0.05}}
engines:
"""
ENGINES = {
    "continuous": "{{policy: fcfs, max_num_seqs: {seqs}, max_model_len: 8192, "
                  "max_num_batched_tokens: 8192}}",
    "static": "{{policy: static, max_num_seqs: 8, max_model_len: 8192, "
              "max_num_batched_tokens: 65536}}",
    "chunked": "{{policy: fcfs, max_num_seqs: 64, chunked_prefill: true, max_model_len: 8192, "
               "max_num_batched_tokens: 2048}}",
}


def night(root: Path, folder: str, *, seqs: int = 64, limit: int = 40,
          engines: tuple[str, ...] = ("continuous", "static")) -> Path:
    """Run the scenario into ``root/folder`` (as ``batchlab run --out root/folder`` would,
    without the report) and return its scenario folder."""
    text = SCENARIO.format(limit=limit) + "".join(
        f"  - name: {e}\n    engine: reference\n    knobs: {ENGINES[e].format(seqs=seqs)}\n"
        for e in engines)
    path = root / f"{folder}.yaml"
    path.write_text(text)
    progress = sc.SweepProgress(len(engines), stream=io.StringIO(), tty=False)
    result = sc.run_scenario(sc.load_scenario(path), root / folder, progress=progress,
                             write_report=False)
    assert [o.state for o in result.outcomes] == ["done"] * len(engines)
    return root / folder / "nightly"


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nights")
    return {
        "n1": night(root, "n1"),
        "n2": night(root, "n2"),  # the same scenario again
        "slow": night(root, "slow", seqs=4),  # continuous capped at 4 sequences
        "other_cells": night(root, "other_cells", engines=("continuous", "chunked")),
        "other_trace": night(root, "other_trace", limit=30),
    }


def by_metric(pair: Pair) -> dict[str, Change]:
    return {ch.metric.name: ch for ch in pair.changes}


# ---------------------------------------------------------------- judging one change


def test_a_change_is_judged_by_the_metrics_direction() -> None:
    ttft, tokens, failed = (metric_named(n) for n in ("ttft_s.p90",
                                                       "throughput.output_tokens_per_s",
                                                       "failures"))
    assert failed.name == "num_failed"  # summary.json's failures, counted
    up = change_of(ttft, 0.100, 0.125, 1.0)
    assert up.change_pct == pytest.approx(25.0) and up.judgement == "worse"
    assert up.change_text == "+25.0%"
    assert change_of(ttft, 0.100, 0.080, 1.0).judgement == "better"
    assert change_of(tokens, 1000.0, 900.0, 1.0).judgement == "worse"
    assert change_of(tokens, 1000.0, 1100.0, 1.0).judgement == "better"
    # within the tolerance: the same; outside a tighter one: not
    assert change_of(ttft, 0.100, 0.1008, 1.0).judgement == "same"
    assert change_of(ttft, 0.100, 0.1008, 0.5).judgement == "worse"
    # a count is the same only when equal, and from 0 has no percentage
    assert change_of(failed, 200, 201, 1.0).judgement == "worse"
    from_zero = change_of(failed, 0, 3, 1.0)
    assert from_zero.change_pct is None and from_zero.judgement == "worse"
    assert from_zero.change_text == "from 0"
    assert change_of(failed, 0, 0, 1.0).judgement == "same"
    gone = change_of(ttft, 0.1, None, 1.0)
    assert gone.judgement == "n/a" and gone.change_text == "–"


def test_every_headline_metric_is_a_summary_field(nights: dict[str, Path]) -> None:
    summary = json.loads((nights["n1"] / "continuous" / "summary.json").read_text())
    for m in METRICS:
        node = summary
        for part in m.name.split("."):
            node = node[part]
        assert isinstance(node, int | float), m.name


# ---------------------------------------------------------------- two nights


def test_a_knob_change_is_paired_by_name_and_judged(nights: dict[str, Path]) -> None:
    result = compare(nights["n1"], nights["slow"])
    assert [p.name for p in result.pairs] == ["continuous", "static"]
    assert not result.added and not result.removed
    continuous, static = (by_metric(p) for p in result.pairs)
    ttft = continuous["ttft_s.p90"]
    assert ttft.change_pct is not None and ttft.change_pct > 0 and ttft.judgement == "worse"
    tokens = continuous["throughput.output_tokens_per_s"]
    assert tokens.change_pct is not None and tokens.change_pct < 0
    assert tokens.judgement == "worse"
    assert {ch.judgement for ch in static.values()} == {"same"}
    # the knob that changed is said, for that cell only; the trace is the same
    assert [(d.cell, d.aspect) for d in result.differences if d.aspect == "knobs"] == [
        ("continuous", "knobs")]
    knobs = next(d for d in result.differences if d.aspect == "knobs")
    assert (knobs.before, knobs.after) == ({"max_num_seqs": 64}, {"max_num_seqs": 4})
    assert "max_num_seqs 64 -> 4" in knobs.text
    assert not any(d.aspect == "trace" for d in result.differences)


def test_identical_nights_are_the_same_everywhere_and_exit_0(
        nights: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", str(nights["n1"]), str(nights["n2"]), "--fail-if", "ttft_s.p90=0",
                 "--fail-if", "failures=0", "--fail-if", "throughput.output_tokens_per_s=0"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""  # nothing differs that a regression test holds fixed
    rows = [line for line in out.splitlines() if line.startswith(("continuous", "static"))]
    assert len(rows) == 2 * len(METRICS)
    assert all("  same" in r for r in rows)
    assert "worse" not in out and "better" not in out and "FAIL" not in out
    assert "checks: passed (3 checks on 2 pairs)" in out
    result = compare(nights["n1"], nights["n2"])
    assert {ch.judgement for p in result.pairs for ch in p.changes} == {"same"}
    assert not result.differences


def test_a_fail_if_threshold_exits_1_naming_the_cell_and_metric(
        nights: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    before, after = str(nights["n1"]), str(nights["slow"])
    assert main(["compare", before, after, "--fail-if", "ttft_s.p90=10"]) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("check failed:")]
    assert len(failed) == 1
    assert failed[0].startswith("check failed: continuous: ttft_s.p90 worse by ")
    assert failed[0].endswith("limit 10%)")
    # throughput fell: worse for a higher-is-better metric
    assert main(["compare", before, after, "--fail-if",
                 "throughput.output_tokens_per_s=5"]) == 1
    assert "continuous: throughput.output_tokens_per_s worse by" in capsys.readouterr().out
    # TPOT got better with fewer sequences: no threshold fails on an improvement
    assert main(["compare", before, after, "--fail-if", "tpot_s.p50=0"]) == 0
    # a threshold above the change passes
    result = compare(nights["n1"], nights["slow"])
    change = by_metric(result.pairs[0])["ttft_s.p90"].change_pct
    assert change is not None
    assert main(["compare", before, after, "--fail-if",
                 f"ttft_s.p90={change + 1:.0f}"]) == 0


def test_the_json_has_the_documented_shape(nights: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ci" / "compare.json"
    code = main(["compare", str(nights["n1"]), str(nights["slow"]), "--json", str(out),
                 "--fail-if", "ttft_s.p90=10"])
    assert code == 1
    assert f"json: {out}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert list(doc) == ["format", "version", "before", "after", "same_within_pct", "checks",
                         "pairs", "added", "removed", "not_comparable", "failed_checks",
                         "unapplied_checks"]
    assert (doc["format"], doc["version"]) == (FORMAT, VERSION) == ("batchlab-compare", 2)
    assert (doc["before"], doc["after"]) == (str(nights["n1"]), str(nights["slow"]))
    assert doc["checks"] == [{"metric": "ttft_s.p90", "max_worse_pct": 10.0}]
    pair = doc["pairs"][0]
    assert list(pair) == ["cell", "compared", "before", "after", "metrics"]
    assert pair["cell"] == "continuous" and pair["compared"] is True
    catalog = prediction_text(prediction_record(ReferenceConfig(
        model="llama-3.1-8b", gpu="h100-sxm")))
    assert pair["before"] == {"dir": str(nights["n1"] / "continuous"), "state": "done",
                              "reason": None, "predicted": True, "prediction": catalog}
    assert [m["metric"] for m in pair["metrics"]] == [m.name for m in METRICS]
    ttft = pair["metrics"][1]
    assert list(ttft) == ["metric", "better", "unit", "before", "after", "change_pct",
                          "judgement"]
    # SI units, exactly as summary.json has them
    summary = json.loads((nights["n1"] / "continuous" / "summary.json").read_text())
    assert (ttft["better"], ttft["unit"]) == ("lower", "s")
    assert ttft["before"] == summary["ttft_s"]["p90"]
    tokens = pair["metrics"][9]
    assert tokens["metric"] == "throughput.output_tokens_per_s"
    assert tokens["before"] == summary["throughput"]["output_tokens_per_s"]
    assert (tokens["better"], tokens["unit"]) == ("higher", "tokens/s")
    assert [f["cell"] for f in doc["failed_checks"]] == ["continuous"]
    assert list(doc["failed_checks"][0]) == ["cell", "metric", "max_worse_pct", "before",
                                             "after", "change_pct", "reason"]
    assert doc["failed_checks"][0]["change_pct"] == ttft["change_pct"]
    assert {d["aspect"] for d in doc["not_comparable"]} >= {"knobs"}
    assert list(doc["not_comparable"][0]) == ["cell", "aspect", "before", "after", "text"]


def test_added_and_removed_cells_are_listed(nights: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    assert main(["compare", str(nights["n1"]), str(nights["other_cells"]),
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "removed (before only): static" in text
    assert "added (after only): chunked" in text
    doc = json.loads(out.read_text())
    assert [p["cell"] for p in doc["pairs"]] == ["continuous"]
    assert doc["removed"] == [{"cell": "static", "dir": str(nights["n1"] / "static")}]
    assert doc["added"] == [{"cell": "chunked", "dir": str(nights["other_cells"] / "chunked")}]


def test_a_different_trace_warns_and_still_compares(nights: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    assert main(["compare", str(nights["n1"]), str(nights["other_trace"]),
                 "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert ("warning: not comparable as a regression test: different trace digest ("
            in captured.err)
    assert captured.err.rstrip().endswith(": every pair")
    assert "continuous  ttft_s.p50" in captured.out  # compared all the same
    doc = json.loads(out.read_text())
    trace = [d for d in doc["not_comparable"] if d["aspect"] == "trace"]
    assert [d["cell"] for d in trace] == ["continuous", "static"]
    manifest = json.loads((nights["n1"] / "static" / "manifest.json").read_text())
    assert trace[1]["before"] == manifest["trace"]["digest"] != trace[1]["after"]


def test_digests_made_two_ways_say_so_rather_than_differ(
        nights: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A night written before the digest was of the requests (no digest_scheme in its
    manifests): its digest differs for the same trace, and the warning says why."""
    old = tmp_path / "old"
    shutil.copytree(nights["n1"], old)
    for manifest in old.glob("*/manifest.json"):
        doc = json.loads(manifest.read_text())
        del doc["trace"]["digest_scheme"]
        doc["trace"]["digest"] = "a" * 64
        manifest.write_text(json.dumps(doc))
    assert main(["compare", str(old), str(nights["n1"])]) == 0
    err = capsys.readouterr().err
    assert "trace digests made two ways (scheme 1 -> 2, a batchlab upgrade)" in err
    assert "different trace digest" not in err


def test_a_cell_that_failed_is_listed_with_its_state(nights: dict[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    after = tmp_path / "nightly"
    shutil.copytree(nights["n2"], after)
    status = json.loads((after / "static" / "status.json").read_text())
    status.update(state="failed", reason="RuntimeError: engine would not start")
    (after / "static" / "status.json").write_text(json.dumps(status))
    (after / "continuous" / "summary.json").unlink()  # a cell that lost its summary
    out = tmp_path / "c.json"
    code = main(["compare", str(nights["n1"]), str(after), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0  # no check asked
    assert "not compared: static: after failed (RuntimeError: engine would not start)" in text
    assert "not compared: continuous: after failed (no summary.json in" in text
    doc = json.loads(out.read_text())
    assert [(p["cell"], p["compared"], p["after"]["state"]) for p in doc["pairs"]] == [
        ("continuous", False, "failed"), ("static", False, "failed")]
    assert doc["pairs"][1]["metrics"] == []
    # with a check, a cell tonight did not finish fails it: its metrics cannot be checked
    assert main(["compare", str(nights["n1"]), str(after), "--fail-if", "e2e_s.p90=10"]) == 1
    assert ("check failed: static: e2e_s.p90 cannot be checked: after failed (RuntimeError"
            in capsys.readouterr().out)
    # ... while one that had not finished last night leaves nothing to regress from
    assert main(["compare", str(after), str(nights["n1"]), "--fail-if", "e2e_s.p90=10"]) == 0


def test_two_run_folders_pair_with_each_other(nights: dict[str, Path], tmp_path: Path) -> None:
    same = compare(nights["n1"] / "continuous", nights["slow"] / "continuous")
    assert [p.name for p in same.pairs] == ["continuous"]
    renamed = tmp_path / "tonight"
    shutil.copytree(nights["slow"] / "continuous", renamed)
    result = compare(nights["n1"] / "continuous", renamed)
    assert [p.name for p in result.pairs] == ["continuous vs tonight"]
    assert not result.added and not result.removed
    assert by_metric(result.pairs[0])["ttft_s.p90"].judgement == "worse"


def _interrupted_copy(run: Path, to: Path) -> Path:
    """A copy of ``run`` whose manifest and summary say it was interrupted (a single run
    folder has no status.json to say otherwise)."""
    shutil.copytree(run, to)
    (to / "status.json").unlink(missing_ok=True)
    for name, extra in (("summary.json", {"status": "interrupted", "num_not_sent": 30}),
                        ("manifest.json", {"status": "interrupted"})):
        doc = json.loads((to / name).read_text())
        (to / name).write_text(json.dumps({**doc, **extra}))
    return to


def test_an_interrupted_run_folder_is_not_compared_and_fails_its_checks(
        nights: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A single run folder has no status.json: its manifest and summary say it was
    interrupted, and its figures (of the requests it sent) must not pass a night's gate."""
    cut = _interrupted_copy(nights["n1"] / "continuous", tmp_path / "cut")
    code = main(["compare", str(nights["n1"] / "continuous"), str(cut),
                 "--fail-if", "throughput.requests_per_s=5"])
    out = capsys.readouterr()
    assert code == 1
    assert "not compared: continuous vs cut: after ended early" in out.out
    assert "check failed: continuous vs cut: throughput.requests_per_s cannot be checked" \
        in out.out
    assert "different" not in out.err  # no warnings about a pair that was not compared


def test_a_check_fails_when_both_sides_did_not_finish(
        nights: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two nights that both crashed: the check cannot be made of the AFTER night, and a
    nightly gate must not go green because the night before crashed too."""
    cut = [str(_interrupted_copy(nights["n1"] / "continuous", tmp_path / name))
           for name in ("cut1", "cut2")]
    assert main(["compare", *cut, "--fail-if", "ttft_s.p90=10"]) == 1
    assert "ttft_s.p90 cannot be checked: after ended early" in capsys.readouterr().out


def test_a_run_stopped_by_an_early_stop_rule_is_compared_with_a_warning(
        nights: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run an early-stop rule ended finished as asked, so it is compared; but its figures
    cover part of its trace, and the comparison says so rather than set them beside a whole
    night's as if alike."""
    stopped = tmp_path / "stopped"
    shutil.copytree(nights["n1"] / "continuous", stopped)
    why = "TTFT p90 above 2 s after 20 requests"
    for name, extra in (("summary.json", {"status": "stopped", "stopped_early": why}),
                        ("manifest.json", {"status": "stopped", "stopped_early": why})):
        doc = json.loads((stopped / name).read_text())
        (stopped / name).write_text(json.dumps({**doc, **extra}))
    assert main(["compare", str(nights["n1"] / "continuous"), str(stopped)]) == 0
    out = capsys.readouterr()
    assert "not compared" not in out.out and "throughput.requests_per_s" in out.out
    assert (f"not comparable as a regression test: after was stopped early ({why}): its "
            "figures cover only the part of its trace it ran: continuous vs stopped") in out.err
    main(["compare", str(nights["n1"] / "continuous"), str(nights["n1"] / "continuous")])
    assert "stopped early" not in capsys.readouterr().err


def test_only_restricts_the_cells(nights: dict[str, Path]) -> None:
    result = compare(nights["n1"], nights["slow"], only=["stat*"])
    assert [p.name for p in result.pairs] == ["static"]
    assert not result.differences


@pytest.mark.parametrize("argv, said", [
    (["--fail-if", "ttft_s.p95=10"], "unknown metric 'ttft_s.p95'; known: ttft_s.p50, "),
    (["--fail-if", "ttft_s.p90"], "expected METRIC=PCT"),
    (["--fail-if", "ttft_s.p90=-1"], "expected METRIC=PCT"),
    (["--only", "nothing*"], "nothing to pair: no cell name is on both sides matching --only"),
])
def test_bad_input_exits_2(nights: dict[str, Path], argv: list[str], said: str,
                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(nights["n1"]), str(nights["slow"]), *argv]) == 2
    assert said in capsys.readouterr().err


def test_a_folder_that_is_no_run_exits_2(nights: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(nights["n1"]), str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), str(nights["n1"])]) == 2
    assert "not a run folder or scenario folder" in capsys.readouterr().err
    with pytest.raises(CompareError, match="nothing to pair"):
        compare(nights["n1"], nights["other_cells"], only=["static"])


# ---------------------------------------------------------------- batchlab report A B


def test_report_labels_two_nights_cells_with_the_folder_given(
        nights: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(nights["n1"].parent.parent)  # the folder holding n1/ and slow/
    cells, _ = collect([Path("n1/nightly"), Path("slow/nightly/")])
    assert [c.name for c in cells] == ["n1/nightly/continuous", "n1/nightly/static",
                                       "slow/nightly/continuous", "slow/nightly/static"]
    single, _ = collect([Path("n1/nightly/static"), Path("slow/nightly/static")])
    assert [c.name for c in single] == ["n1/nightly/static", "slow/nightly/static"]


def test_the_help_lists_every_metric_and_the_exit_codes() -> None:
    from harness.cli.compare import EPILOG

    listed = EPILOG.split("metrics (")[1].split("examples:")[0].split(":", 1)[1].split()
    names = [w.rstrip("+") for w in listed if "." in w or w == "num_failed"]
    assert names == [m.name for m in METRICS]
    assert [w.endswith("+") for w in listed if "." in w] == [
        m.better == "higher" for m in METRICS if "." in m.name]
    for code in ("0  every --fail-if check passed", "1  a --fail-if check failed",
                 "2  bad input"):
        assert code in EPILOG


def test_goodput_under_another_slo_warns_and_is_not_judged(
        nights: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``batchlab summarize --slo`` recomputes goodput under another SLO and leaves the
    manifest's as it was: the summary's SLO is the one compared, and goodput under two SLOs is
    shown, not judged, nor gated."""
    strict = tmp_path / "strict"
    shutil.copytree(nights["n1"] / "continuous", strict)
    assert main(["summarize", str(strict), "--slo", "ttft_s=0.02,tpot_s=0.05"]) == 0
    capsys.readouterr()
    result = compare(nights["n1"] / "continuous", strict)
    assert [d.aspect for d in result.differences] == ["slo"]
    changes = by_metric(result.pairs[0])
    attainment = changes["goodput.slo_attainment"]
    assert attainment.before is not None and attainment.after is not None
    assert attainment.after < attainment.before  # it did move
    assert changes["goodput.slo_attainment"].judgement == "n/a"
    assert changes["goodput.requests_per_s"].judgement == "n/a"
    assert changes["ttft_s.p90"].judgement == "same"  # the latencies themselves are the same
    code = main(["compare", str(nights["n1"] / "continuous"), str(strict),
                 "--fail-if", "goodput.slo_attainment=1"])
    out = capsys.readouterr()
    assert code == 1
    assert "goodput.slo_attainment cannot be checked: the two runs' goodput was computed " \
        "under different SLOs" in out.out
    assert "not comparable as a regression test: different SLO" in out.err


def test_predicted_figures_say_so_and_how_accurate_such_predictions_are(
        nights: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every figure compare printed was a prediction of the reference engine, and nothing
    said so: each prediction is named with the side and cells it concerns,
    in the words simulate prints, with its measured accuracy; measured sides are not."""
    catalog = prediction_text(prediction_record(ReferenceConfig(
        model="llama-3.1-8b", gpu="h100-sxm")))
    assert "missed by a median" in catalog
    assert main(["compare", str(nights["n1"]), str(nights["slow"])]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"both sides, every cell: {catalog}"
    # one run folder against a copy said to be measured on a real engine
    measured = tmp_path / "measured"
    shutil.copytree(nights["slow"] / "continuous", measured)
    manifest = json.loads((measured / "manifest.json").read_text())
    manifest["engine"] = {"name": "vllm", "mode": "live", "version": "0.19.0"}
    (measured / "manifest.json").write_text(json.dumps(manifest))
    assert main(["compare", str(nights["n1"] / "continuous"), str(measured),
                 "--json", str(tmp_path / "c.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"before: {catalog}" in lines
    assert not any(line.startswith(("after: predicted", "both sides")) for line in lines)
    doc = json.loads((tmp_path / "c.json").read_text())["pairs"][0]
    assert (doc["before"]["predicted"], doc["before"]["prediction"]) == (True, catalog)
    assert (doc["after"]["predicted"], doc["after"]["prediction"]) == (False, None)
