"""A live run that fails while it sets its folder up (after claiming it, before the engine
session) leaves a manifest that says it failed, not one that says "starting"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.live import run as live
from harness.live.testing import server_in_thread
from harness.target import RunOptions, TargetSpec
from harness.traces import TraceOptions, load_trace


def test_a_failure_before_the_engine_session_is_in_the_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scraper(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(live, "TelemetryScraper", no_scraper)
    trace = load_trace("synthetic", TraceOptions(num_requests=3, rate=20, prompt_tokens=8,
                                                 output_tokens=4))
    with server_in_thread(ttft_s=0.0, itl_s=0.0) as server:
        target = TargetSpec("reference", "attach", model="m", url=server.url,
                            telemetry_interval_s=None)
        with pytest.raises(OSError, match="No space left"):
            live.run_live(target, trace, tmp_path / "run", RunOptions())
        assert server.stats.num_requests == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "No space left on device" in manifest["error"]
