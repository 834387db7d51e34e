"""A trace's priorities on each engine: the scale they are sent in, whether they are sent, and
what the manifest says (nothing is sent that the engine would answer with HTTP 400).

The engines' facts are ``../shared/reference/engines.md`` §2.1, §5 and §6, as tabled at
``harness.live.protocols.plan_priority``.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from adapters.base import Knobs
from adapters.base import unit_float_priority as trtllm_priority
from adapters.process import ServerProcess
from harness.cli import main
from harness.live import run as live
from harness.live.protocols import (
    Prompt,
    build_body,
    plan_priority,
    wire_priority,
)
from harness.live.replay import ReplayConfig, replay
from harness.live.testing import ScheduledStreamServer, server_in_thread
from harness.target import UNSET, RunOptions, TargetSpec
from harness.traces import Trace, TraceRequest

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"

CONVERTED = ("converted: trace priority p sent as 0.5 - atan(p)/pi, TensorRT-LLM serves higher "
             "first")
TRTLLM_NOT_APPLIED = ("not applied: TensorRT-LLM orders by priority only with --policy "
                      "priority")
VLLM_APPLIED = ("applied: sent in the request's 'priority' field, in vLLM's convention (lower "
                "is served first)")
NOT_KNOWN = "sent; the server's policy is not known; "
VLLM_SCALE = "in vLLM's convention (lower is served first)"
NO_ENGINE = "in vLLM's convention (lower is served first), as no --engine names the server"


def not_sent(engine: str, policy: str = "fcfs") -> str:
    return (f"not sent: 2 of 4 requests have a priority other than 0, which {engine} answers "
            f"with HTTP 400 under --policy {policy}; its queue is FCFS, so they are sent "
            "without one (--policy priority orders by them)")


def trace(priorities: tuple[int | None, ...] = (0, 1, 0, 1)) -> Trace:
    requests = tuple(TraceRequest(f"r{i}", i * 0.01, 16, 3, priority=p)
                     for i, p in enumerate(priorities))
    return Trace(requests, source="test", format="test", digest="0" * 64)


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: ServerProcess) -> None:
        raise AssertionError("a dry run must not start anything")

    monkeypatch.setattr(ServerProcess, "start", refuse)


def dry_run(engine: str, knobs: Knobs, tr: Trace, *, launch: bool = True,
            **spec: Any) -> tuple[str, dict[str, Any]]:
    target = TargetSpec(engine, "launch" if launch else "attach", knobs=knobs, **spec)
    out = io.StringIO()
    result = live.run_live(target, tr, Path("unused"), RunOptions(), dry_run=True, out=out)
    return out.getvalue(), result


# ---------------------------------------------------------------- defect 1: TensorRT-LLM's scale


def test_trtllm_priority_reverses_vllms_order_into_0_1_keeping_the_default_at_half() -> None:
    assert trtllm_priority(0) == 0.5  # vLLM's default is TensorRT-LLM's default
    assert trtllm_priority(1) == 0.25 and trtllm_priority(-1) == 0.75
    assert trtllm_priority(5) == pytest.approx(0.0628329581890012, abs=1e-15)
    values = [trtllm_priority(p) for p in range(-1000, 1001)]
    assert all(0 < v < 1 for v in values)
    assert all(a > b for a, b in itertools.pairwise(values))  # lower p: served first


def test_the_body_carries_the_priority_in_the_engines_scale() -> None:
    prompt = Prompt("token_ids", token_ids=(1, 2))
    for engine, sent in (("trtllm", 0.25), ("vllm", 1), ("reference", 1), (None, 1)):
        body = build_body("openai", prompt, num_output_tokens=2, priority=1, engine=engine)
        assert body["priority"] == sent and type(body["priority"]) is type(sent)
    body = build_body("openai-chat", Prompt("approx_text", text=" a"), num_output_tokens=2,
                      priority=0, engine="trtllm")
    assert body["priority"] == 0.5
    assert wire_priority(-3, "trtllm") == trtllm_priority(-3) and wire_priority(-3, None) == -3


def replay_bodies(tmp_path: Path, tr: Trace, **config: Any) -> tuple[dict[str, Any],
                                                                     dict[str, Any]]:
    async def go() -> ScheduledStreamServer:
        async with ScheduledStreamServer(ttft_s=0.0, itl_s=0.0, keep_bodies=True) as server:
            await replay(tr, ReplayConfig(target_url=server.url, **config), tmp_path)
            return server

    server = asyncio.run(go())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    return dict(zip(server.stats.request_ids, server.stats.bodies, strict=True)), manifest


def test_a_trtllm_replay_sends_converted_priorities_and_says_so(tmp_path: Path) -> None:
    bodies, manifest = replay_bodies(tmp_path, trace((0, 1, -1, 5)), engine="trtllm",
                                     server_policy="priority")
    assert {rid: b["priority"] for rid, b in bodies.items()} == {
        "r0": 0.5, "r1": 0.25, "r2": 0.75, "r3": trtllm_priority(5)}
    assert manifest["priority"] == CONVERTED
    assert manifest["replay"]["engine"] == "trtllm"


def test_an_attached_trtllm_gets_converted_priorities_end_to_end(tmp_path: Path) -> None:
    """``replay --engine trtllm --url URL --policy priority --allow-approximate``: run_live
    tells the replay which engine it talks to."""
    with server_in_thread(ttft_s=0.0, itl_s=0.0, keep_bodies=True) as server:
        target = TargetSpec("trtllm", "attach", knobs=Knobs.from_mapping({"policy": "priority"}),
                            model="m", url=server.url, allow_approximate=True,
                            telemetry_interval_s=None)
        summary = live.run_live(target, trace(), tmp_path / "run",
                                RunOptions(replay={"timeout_s": 10}))
        bodies = dict(zip(server.stats.request_ids, server.stats.bodies, strict=True))
    assert summary["num_completed"] == 4
    assert {rid: b["priority"] for rid, b in bodies.items()} == {
        "r0": 0.5, "r1": 0.25, "r2": 0.5, "r3": 0.25}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["priority"] == CONVERTED


# ---------------------------------------------------------------- defect 2: policy and engine


@pytest.mark.parametrize(("engine", "policy", "priorities", "note"), [
    (None, None, (0, 1), NOT_KNOWN + NO_ENGINE),
    ("vllm", None, (0, 1), NOT_KNOWN + VLLM_SCALE),
    ("vllm", "priority", (0, 1), VLLM_APPLIED),
    ("reference", "priority", (0, 1), VLLM_APPLIED),
    ("vllm", "fcfs", (0, 0, None),
     "not applied: the server's policy is fcfs, which does not order by priority (every "
     "request has priority 0)"),
    ("trtllm", "priority", (0, 1), CONVERTED),
    ("trtllm", "fcfs", (0, 1), TRTLLM_NOT_APPLIED),
    ("trtllm", "static", (0, 1), TRTLLM_NOT_APPLIED),
    ("trtllm", None, (0, 1), NOT_KNOWN + CONVERTED),
    ("llamacpp", "fcfs", (0, 1), "not applied: llama-server has no request priority"),
    ("llamacpp", None, (0, 1), "not applied: llama-server has no request priority"),
    ("vllm", "priority", (None, None), "none: no request has a priority"),
])
def test_the_priority_note_is_true_for_each_engine_and_policy(
        engine: str | None, policy: str | None, priorities: tuple[int | None, ...],
        note: str) -> None:
    plan = plan_priority(priorities, "openai", engine, policy)
    assert plan.note == note
    assert plan.send == (not note.startswith(("not applied", "none")))


def test_tgi_protocol_sends_no_priority_whatever_the_engine() -> None:
    plan = plan_priority((0, 1), "tgi", "tgi", "fcfs")
    assert (plan.send, plan.note) == (False, "not applied: the tgi protocol has no priority field")


@pytest.mark.parametrize("engine", ["vllm", "reference"])
def test_non_zero_priorities_under_fcfs_are_not_sent_where_the_engine_refuses_them(
        engine: str) -> None:
    """vLLM answers HTTP 400 to a priority other than 0 under FCFS: half the requests failed.
    Its FCFS queue ignores them anyway, so an FCFS cell beside a priority cell on one trace
    is sent them without (and says so), rather than failing or being refused."""
    plan = plan_priority((0, 1, None, 1, 0), "openai", engine, "fcfs")
    assert (plan.send, plan.note) == (False, not_sent(engine))


def test_a_trtllm_replay_under_fcfs_sends_no_priority(tmp_path: Path) -> None:
    bodies, manifest = replay_bodies(tmp_path, trace(), engine="trtllm", server_policy="fcfs")
    assert all("priority" not in b for b in bodies.values()) and len(bodies) == 4
    assert manifest["priority"] == TRTLLM_NOT_APPLIED


def vllm_dry_run(tmp_path: Path, *flags: str) -> int:
    """``replay --engine vllm --launch --dry-run`` of four requests, half of priority 1."""
    model = tmp_path / "m"
    model.mkdir()
    return main([
        "replay", "--engine", "vllm", "--launch", "--model-path", str(model), "--model", "tiny",
        "--max-model-len", "2048", "--trace", str(EXCERPT), "--limit", "4",
        "--priority-fraction", "0.5", *flags, "--dry-run", "--out", str(tmp_path / "o"),
    ])


def test_vllm_dry_run_with_a_priority_fraction_and_fcfs_says_they_are_not_sent(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, nothing_starts: None) -> None:
    code = vllm_dry_run(tmp_path)
    out = capsys.readouterr().out
    assert code == 0
    assert "request priority: not sent: " in out and "which vllm answers with HTTP 400" in out


def test_vllm_dry_run_with_the_priority_policy_plans_and_says_applied(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, nothing_starts: None) -> None:
    code = vllm_dry_run(tmp_path, "--policy", "priority")
    out = capsys.readouterr().out
    assert code == 0
    assert f"request priority: {VLLM_APPLIED}\n" in out


def test_launch_plans_say_what_each_engine_does_with_priorities(
        tmp_path: Path, nothing_starts: None) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.touch()
    cases = [
        ("trtllm", Knobs.from_mapping({}), "m", TRTLLM_NOT_APPLIED),
        ("trtllm", Knobs.from_mapping({"policy": "priority"}), "m", CONVERTED),
        ("llamacpp", Knobs.from_mapping({}), str(gguf),
         "not applied: llama-server has no request priority"),
        ("vllm", Knobs.from_mapping({"policy": "priority"}), "m", VLLM_APPLIED),
    ]
    for engine, knobs, model, note in cases:
        text, result = dry_run(engine, knobs, trace(), model=model, port=8123)
        assert result["priority"] == note, engine
        assert f"request priority: {note}\n" in text


def test_vllm_launch_sends_no_priority_also_when_policy_is_unset_or_approximated(
        nothing_starts: None) -> None:
    for knobs, allow in ((Knobs.from_mapping({}), False),
                         (Knobs.from_mapping({"policy": "static"}), True)):
        _, result = dry_run("vllm", knobs, trace(), model="m", allow_approximate=allow)
        assert result["priority"] == not_sent("vllm")


def test_an_attached_vllm_of_unknown_policy_is_sent_and_said_so(nothing_starts: None) -> None:
    _, result = dry_run("vllm", UNSET, trace(), launch=False, model="m",
                        url="http://127.0.0.1:9")
    assert result["priority"] == NOT_KNOWN + VLLM_SCALE


def test_an_attached_reference_reporting_fcfs_is_sent_no_priority(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The served reference says its policy at /version: known only after the probe, still
    before the first request, which goes without a priority."""
    async def probe(base_url: str, paths: Any) -> dict[str, Any]:
        return {"version": "x", "body": {"engine": "batchlab-reference",
                                         "reference": {"policy": "fcfs"}}}

    monkeypatch.setattr(live, "probe_version", probe)
    with server_in_thread(ttft_s=0.0, itl_s=0.0, keep_bodies=True) as server:
        target = TargetSpec("reference", "attach", model="m", url=server.url,
                            telemetry_interval_s=None)
        live.run_live(target, trace(), tmp_path / "run", RunOptions())
        assert server.stats.num_requests == 4
        assert all("priority" not in body for body in server.stats.bodies)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["knobs"]["policy"] == "fcfs"
    assert manifest["priority"] == not_sent("reference")
