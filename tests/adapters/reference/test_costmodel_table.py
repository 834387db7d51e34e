"""`batchlab costmodel`'s table and header: the configuration simulate uses, the batches the
engine runs, and every term of a step's time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adapters.knobs import Knobs
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import PROFILES_DIR
from adapters.reference.table import (
    costmodel_report,
    costmodel_table,
    largest_batch,
    max_batch_in_kv,
)
from harness.cli import main
from harness.manifest import read_manifest

EXCERPT = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"


def _costmodel(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["costmodel", *argv]) == 0
    return capsys.readouterr().out


def _kv_blocks(out: str) -> tuple[int, int]:
    found = re.search(r"([\d,]+) blocks of (\d+) tokens", out)
    assert found, out
    return int(found.group(1).replace(",", "")), int(found.group(2))


def _rows(out: str) -> list[list[str]]:
    return [f for f in (line.split() for line in out.splitlines())
            if len(f) == 8 and f[0].isdigit()]


@pytest.mark.parametrize(("argv", "knobs"), [
    (("--profile", "trtllm-h100-sxm"), {}),  # its engine's defaults: block size 32, 2,048 seqs
    (("--max-num-batched-tokens", "65536", "--max-num-seqs", "1024"),
     {"max_num_batched_tokens": 65536, "max_num_seqs": 1024}),
])
def test_kv_blocks_are_those_simulate_uses(capsys: pytest.CaptureFixture[str],
                                           argv: tuple[str, ...], knobs: dict[str, int]) -> None:
    profile = argv[1] if argv[0] == "--profile" else None
    config = ReferenceConfig.from_knobs(Knobs.from_mapping(knobs), model="llama-3.1-8b",
                                        gpu=None, profile=profile)
    out = _costmodel(capsys, *argv)
    assert _kv_blocks(out) == (config.resolved_num_gpu_blocks(), config.block_size)
    assert _kv_blocks(out) != _kv_blocks(_costmodel(capsys))  # the flags and profile count


def test_kv_blocks_match_the_simulated_runs_manifest(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    flags = ["--profile", "trtllm-h100-sxm", "--max-num-seqs", "512"]
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "3", "--no-report",
                 "--out", str(tmp_path / "sim"), *flags]) == 0
    recorded = read_manifest(tmp_path / "sim")["engine"]["config"]
    capsys.readouterr()
    out = _costmodel(capsys, *flags)
    assert _kv_blocks(out) == (recorded["num_gpu_blocks"], recorded["block_size"])
    assert recorded["block_size"] == 32  # the profile's engine default
    assert "max_num_seqs 512," in out


def test_rows_beyond_max_num_seqs_are_not_said_to_run(capsys: pytest.CaptureFixture[str]) -> None:
    out = _costmodel(capsys, "--profile", "vllm-h100-sxm", "--max-num-seqs", "64")
    rows = {int(r[0]): r[1] for r in _rows(out)}
    assert rows == {1: "yes", 4: "yes", 16: "yes", 64: "yes", 256: "no-seqs"}
    assert "beyond max_num_seqs (64)" in out
    assert "the largest batch that runs is 64" in out


def test_the_largest_row_is_the_largest_batch_the_engine_runs() -> None:
    # defaults: the KV cache holds 428 requests of 1,025 tokens, max_num_seqs is 256
    config = ReferenceConfig()
    rows = costmodel_table(config, 1024)
    assert largest_batch(config, 1024) == 256
    assert [r.batch_size for r in rows] == [1, 4, 16, 64, 256] and all(r.runs for r in rows)
    # a KV cache smaller than max_num_seqs: its limit is the last row that runs
    small = ReferenceConfig(num_gpu_blocks=65 * 100)
    rows = costmodel_table(small, 1024)
    assert [r.batch_size for r in rows] == [1, 4, 16, 64, 100, 256]
    assert [r.runs for r in rows] == [True] * 5 + [False]
    assert not rows[-1].fits_in_kv and rows[-1].within_max_num_seqs
    wide = ReferenceConfig(max_num_seqs=1024)  # the KV cache's limit: 425 (more logits reserved)
    assert costmodel_table(wide, 1024)[-1].batch_size == max_batch_in_kv(wide, 1024) == 425


def test_header_shows_the_all_reduce_and_fp8_kv_terms(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--profile", "vllm-h100-sxm", "--model", "llama-3.1-70b", "--tp", "4")
    out = _costmodel(capsys, *argv)
    config = ReferenceConfig(model="llama-3.1-70b", tp=4, profile="vllm-h100-sxm")
    cost, p = config.cost_model(), config.params
    # 2 all-reduces x 80 layers at the profile's latency (35 us: 5.6 ms of the 6.4 ms batch 1
    # spends beyond memory)
    each_us = p.allreduce_latency_s * 1e6
    assert (f"all-reduce {160 * each_us / 1000:.2f} ms/step (160 x {each_us:.1f} us: 2 per "
            "layer at tp 4) + 8.74 us/token") in out
    step = cost.decode_step_cost(1, 1024)
    shown = (p.step_overhead_s + p.per_seq_overhead_s + cost.allreduce_fixed_s
             + cost.allreduce_per_token_s)
    assert shown == pytest.approx(step.overhead_s)
    assert "FP8 KV" not in out
    fp8 = _costmodel(capsys, "--profile", "vllm-h100-sxm", "--kv-cache-dtype", "fp8")
    assert (f"+ {p.per_fp8_kv_token_overhead_s * 1e9:.1f} ns per KV token read (FP8 KV "
            "dequantisation)") in fp8
    assert "all-reduce" not in fp8


def test_printed_ridge_is_where_the_bound_column_turns(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _costmodel(capsys, "--profile", "vllm-h100-sxm", "--model", "llama-3.1-70b",
                     "--tp", "4")
    found = re.search(r"ridge (\d+) FLOP/byte at these efficiencies.*datasheet peaks: (\d+)", out)
    assert found and (int(found.group(1)), int(found.group(2))) == (200, 295)
    ridge = int(found.group(1))
    rows = _rows(out)
    assert {r[5] for r in rows} == {"memory", "compute"}  # 459 at 222 FLOP/byte: compute
    for r in rows:
        assert (r[5] == "compute") == (float(r[4]) > ridge), r


def test_an_edited_copy_of_a_profile_says_so(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    raw = json.loads((PROFILES_DIR / "vllm-h100-sxm.json").read_text())
    fitted = f"coefficients: {raw['source']}"  # "vllm-h100-sxm: fitted on published ..."
    assert raw["source"].startswith("vllm-h100-sxm: fitted on published measurements, ")
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps({**raw, "_note": "mine"}))
    assert f"{fitted}\n" in _costmodel(capsys, "--profile", str(copy))
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**raw, "memory_efficiency": 0.5}))
    out = _costmodel(capsys, "--profile", str(edited))
    assert f"{fitted}, but {edited} is an edited copy: its coefficients or engine defaults " \
           "differ from the fitted ones" in out


def test_the_report_takes_the_resolved_configuration() -> None:
    config = ReferenceConfig(block_size=32, max_num_seqs=64)
    report = costmodel_report(config, 512)
    assert f"{config.resolved_num_gpu_blocks():,} blocks of 32 tokens" in report
    assert "decode with 512 tokens of context" in report


def test_calibrate_help_points_to_a_command_that_lists_models(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--list" not in text and "`batchlab costmodel --help` lists them" in text
    with pytest.raises(SystemExit):
        main(["costmodel", "--help"])
    assert "llama-3.1-70b" in capsys.readouterr().out
