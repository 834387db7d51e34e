"""Replaying a trace against the served reference engine gives the TTFT and TPOT that simulating
it gives, within the client's timing error.

This checks the live path end to end: ``batchlab serve reference`` (a child process, so it does
not share a GIL with the client) runs the scheduler and cost model of ``simulate`` on the wall
clock, and ``harness.live.replay`` measures it. The model is llama-3.1-70b on 4 A100s: decode steps
of about 23 ms and prefill steps of 50-800 ms, long next to the millisecond-scale errors below.

Where the served run differs from the simulation, and by how much:

- Each request reaches the server a little after the client stamps ``sent_s`` (loopback and
  HTTP parsing: a fraction of a millisecond idle, a few ms on a loaded machine), and each token
  reaches the client a little after the step's predicted end (the event loop's timer rounds up
  to a millisecond; then the socket and the client's read). Both add to TTFT; TPOT, a mean over
  ~90 gaps, hardly sees them.
- That jitter can move a request that arrives within it of a step boundary into the next step
  (+1 step to its TTFT, and a slightly different batch for a few others). Medians absorb a few.

Bounds, on the medians over requests: TTFT within 10 ms + 10% of the simulated median + twice
the client's measured send-lag p99 (the client's own view of how starved the machine is: on a
quiet machine under 1 ms, on a loaded 2-core machine 5-20 ms, and the same starvation delays
the server's accept and the token's delivery); TPOT within 2 ms + 5%. A wrong cost model, a
different policy or a client that mis-times chunks misses these by far more. This is a check of
correctness, not of speed: nothing here bounds how long anything takes.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from adapters.reference.config import ReferenceConfig
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.metrics import summarize
from harness.serve import launch_server_process
from harness.sim import simulate
from harness.traces import TraceOptions, load_trace

TRACE = "harness/data/azure_conv_excerpt.csv"
ENGINE_ARGS = ("--model", "llama-3.1-70b", "--gpu", "a100-80gb", "--tp", "4")


def test_replaying_the_served_reference_agrees_with_simulating_it(tmp_path: Path) -> None:
    trace = load_trace(TRACE, TraceOptions(limit=20, rate=4))  # ~5 s of arrivals, ~10 s wall
    config = ReferenceConfig(model="llama-3.1-70b", gpu="a100-80gb", tp=4)
    simulated = summarize(simulate(trace.requests, config).timelines)

    with launch_server_process(ENGINE_ARGS, log_path=tmp_path / "server.log") as server:
        served = asyncio.run(replay(trace, ReplayConfig(target_url=server.url,
                                                        protocol="openai"), tmp_path / "run"))
    timelines = read_records(tmp_path / "run" / RECORDS_FILE)  # (extra fields included)

    # Every request came back whole, counted by the server, with the trace's lengths.
    assert len(timelines) == len(trace.requests)
    for tl in timelines:
        assert tl.ok, (tl.request_id, tl.error_kind, tl.error_message)
        assert tl.token_count_source == "usage"
        assert tl.output_tokens == tl.num_target_output_tokens
        assert tl.extra["server_num_prompt_tokens"] == tl.num_prompt_tokens
        assert tl.chunk_num_tokens == (1,) * tl.num_target_output_tokens

    send_lag_p99_s = served["send_lag_s"]["p99"]
    ttft_sim, ttft_served = simulated["ttft_s"]["p50"], served["ttft_s"]["p50"]
    tpot_sim, tpot_served = simulated["tpot_s"]["p50"], served["tpot_s"]["p50"]
    ttft_bound = 0.010 + 0.10 * ttft_sim + 2 * send_lag_p99_s
    tpot_bound = 0.002 + 0.05 * tpot_sim
    report = (f"TTFT p50 simulated {ttft_sim * 1e3:.1f} ms, served {ttft_served * 1e3:.1f} ms "
              f"(bound {ttft_bound * 1e3:.1f}); TPOT p50 simulated {tpot_sim * 1e3:.2f} ms, "
              f"served {tpot_served * 1e3:.2f} ms (bound {tpot_bound * 1e3:.2f}); client "
              f"send-lag p99 {send_lag_p99_s * 1e3:.1f} ms")
    assert math.isfinite(ttft_served) and math.isfinite(tpot_served), report
    assert abs(ttft_served - ttft_sim) <= ttft_bound, report
    assert abs(tpot_served - tpot_sim) <= tpot_bound, report


def test_a_replay_against_the_served_reference_is_labelled_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`replay --target` at a `batchlab serve reference`: the run records what the server's
    /version says (its prediction record), so the command line and a report label its figures
    predicted, and the report's fidelity section says it compares the simulation with its own
    served form."""
    from harness.cli import main

    small = ["--trace", TRACE, "--limit", "6", "--rate", "4"]
    with launch_server_process(("--model", "llama-3.1-8b", "--gpu", "h100-sxm"),
                               log_path=tmp_path / "server.log") as server:
        assert main(["replay", "--target", server.url, "--protocol", "openai", "--model",
                     "llama-3.1-8b", *small, "--out", str(tmp_path / "served")]) == 0
    out = capsys.readouterr().out
    assert ("figures above: predicted by the reference engine served over HTTP (step times "
            "from its cost model; HTTP and client time measured) with the catalog's datasheet "
            "coefficients\n  on ") in out
    assert main(["simulate", *small, "--no-report", "--out", str(tmp_path / "sim")]) == 0
    engine = json.loads((tmp_path / "served" / "manifest.json").read_text())["engine"]
    assert engine["mode"] == "attach" and engine["version_probe"]["body"]["prediction"]
    assert main(["report", str(tmp_path / "sim"), str(tmp_path / "served"), "--baseline",
                 "sim", "-o", str(tmp_path / "cmp" / "report.md")]) == 0
    report = (tmp_path / "cmp" / "report.md").read_text()
    predicted = next(ln for ln in report.splitlines() if ln.startswith("| Predicted |"))
    assert "`served`: **predicted** by the reference engine served over HTTP" in predicted
    assert "### `served` served, `sim` simulated" in report
    # the server's /version says how it is configured: its knobs and GPU are known
    assert "Knobs common to every cell: max_num_seqs=256, " in report
    manifest = json.loads((tmp_path / "served" / "manifest.json").read_text())
    assert manifest["gpu"] == "h100-sxm" and manifest["engine"]["name"] == "reference"
    assert manifest["knobs"]["max_num_seqs"] == 256
    assert set(manifest["knob_sources"].values()) == {"reported"}
    assert "`served` ran on a server started outside batchlab" in report


def test_a_live_run_reports_the_engines_preemptions_not_the_clients_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A client cannot see preemptions. With the engine's telemetry scraped (`--engine
    reference --url`), the summary counts the engine's own preemptions; without it (`--target`)
    they are not known, never a false zero."""
    from harness.cli import main

    small = ["--trace", TRACE, "--limit", "60", "--rate", "16", "--max-model-len", "4096",
             "--on-too-long", "clip"]
    with launch_server_process(("--num-gpu-blocks", "500", "--max-model-len", "4096"),
                               log_path=tmp_path / "server.log") as server:
        assert main(["replay", "--engine", "reference", "--url", server.url, *small,
                     "--out", str(tmp_path / "scraped")]) == 0
        assert main(["replay", "--target", server.url, "--protocol", "openai", *small,
                     "--out", str(tmp_path / "blind")]) == 0
    import pyarrow.parquet as pq

    telemetry = pq.read_table(tmp_path / "scraped" / "telemetry.parquet").to_pydict()
    counted = round(sum(v for v in telemetry["num_preemptions"] if v is not None))
    scraped = json.loads((tmp_path / "scraped" / "summary.json").read_text())
    assert counted > 0 and scraped["num_preemptions"] == counted
    assert scraped["preemptions_from"] == "the engine's telemetry (its preemption counter)"
    blind = json.loads((tmp_path / "blind" / "summary.json").read_text())
    assert blind["num_preemptions"] is None
    assert blind["preemptions_from"].startswith("not known: a client cannot see preemptions, "
                                                "and no engine telemetry was scraped")
    # no --model: the manifest names the model the server says it serves
    assert json.loads((tmp_path / "blind" / "manifest.json").read_text())["model"] == (
        "llama-3.1-8b")
    assert "preemptions not known" in capsys.readouterr().out
    # re-summarised, a live folder keeps the engine's count
    assert main(["summarize", str(tmp_path / "scraped")]) == 0
    again = json.loads((tmp_path / "scraped" / "summary.json").read_text())
    assert again["num_preemptions"] == counted
    assert main(["report", str(tmp_path / "scraped"), str(tmp_path / "blind"),
                 "-o", str(tmp_path / "cmp.md")]) == 0
    table = (tmp_path / "cmp.md").read_text().split("## Preemptions", 1)[1].split("\n## ")[0]
    assert f"| `scraped` | {counted:,} | – |" in table
    assert "| `blind` | not known | – | – |" in table
