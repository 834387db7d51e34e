"""The openai adapter against a real continuous-batching server on CPU: ``transformers serve``.

The server is started with batchlab's own lifecycle (``ServerProcess``) and attached to with
``--engine openai --url``. It has no ``/metrics``, so every telemetry signal must come out
missing (null), never zero. It cannot force an output length (no ``ignore_eos``), so lengths
are reported, not asserted. Needs ``make engines`` (it runs from the vLLM venv).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from adapters.base import Knobs
from adapters.process import ServerProcess, free_port
from harness.live import run as live
from harness.target import UNSET, RunOptions, TargetSpec
from harness.traces import Trace, TraceOptions, load_trace


def run_live(engine: str, knobs: Knobs, trace: Trace, replay: dict[str, Any],
             out_dir: Path | str, *, launch: bool = True, dry_run: bool = False,
             out: Any = None, **spec: Any) -> dict[str, Any]:
    """``harness.live.run_live`` with a ``TargetSpec`` built from keyword arguments."""
    target = TargetSpec(engine, "launch" if launch else "attach", knobs=knobs, **spec)
    return live.run_live(target, trace, Path(out_dir), RunOptions(replay=replay),
                         dry_run=dry_run, out=out)

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venvs" / "vllm" / "bin"
MODEL = REPO / "models" / "tiny-llama"
TRACE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]


def test_transformers_serve_through_the_openai_adapter(tmp_path: Path) -> None:
    missing = [str(p.relative_to(REPO)) for p in (VENV_BIN / "transformers", MODEL)
               if not p.exists()]
    if missing:
        reason = f"{', '.join(missing)} missing: run `make engines`"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run real engines, but {reason}")
        pytest.skip(reason)
    port = free_port()
    argv = [
        str(VENV_BIN / "transformers"), "serve", str(MODEL), "--continuous-batching",
        # bounded paged KV: without --cb-num-blocks it is sized from system memory
        "--cb-num-blocks", "256", "--cb-block-size", "32", "--cb-max-batch-tokens", "512",
        "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
    ]
    trace = load_trace(TRACE, TraceOptions(limit=8, time_scale=0.02, prompt_tokens=16,
                                           output_tokens=16, max_model_len=512))
    out = tmp_path / "run"
    with ServerProcess(argv, log_dir=tmp_path, name="transformers",
                       env={"HF_HUB_OFFLINE": "1"}) as server:
        server.start()
        asyncio.run(server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=300))
        summary = run_live(
            "openai", UNSET, trace, {"timeout_s": 120, "length_control": "transformers"}, out,
            launch=False,
            url=f"http://127.0.0.1:{port}", model=str(MODEL), metric_map="transformers",
            telemetry_interval_s=0.1,
        )
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    assert summary["num_requests"] == 8
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"]["name"] == "openai" and manifest["engine"]["mode"] == "attach"
    assert {m["status"] for m in manifest["mapping"]} == {"not_applied"}
    assert manifest["telemetry"]["missing"] == [
        "num_running", "num_waiting", "kv_usage", "num_preemptions", "batch_tokens",
        "prefix_cache_queries", "prefix_cache_hits"]
    telemetry = pq.read_table(out / "telemetry.parquet").to_pylist()
    assert telemetry and all(r["num_running"] is None for r in telemetry)
    # transformers serve rejects ignore_eos/min_tokens (HTTP 422); generation_config forces
    # the length instead.
    assert summary["num_completed"] == 8, [(r["error_kind"], r["error_message"]) for r in requests]
    assert all(r["reached_target_length"] for r in requests)
