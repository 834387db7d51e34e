"""Aborting a request of the served engine (``ServedEngine.abort``, ``Scheduler.abort``),
stepped by hand: wherever the request is (pending, waiting, running, swapped out), it leaves
with its blocks freed and the invariants hold; a request that already finished is left alone."""

from __future__ import annotations

import pytest

from adapters.reference.config import ReferenceConfig
from adapters.reference.request import RequestStatus
from harness.serve.loop import EngineObserver, ServedEngine, TokenStream


class Aborts(EngineObserver):
    def __init__(self) -> None:
        self.aborted: list[tuple[str, int]] = []
        self.finished: list[str] = []

    def on_aborted(self, stream: TokenStream) -> None:
        self.aborted.append((stream.request_id, stream.num_tokens))

    def on_finished(self, stream: TokenStream) -> None:
        self.finished.append(stream.request_id)


def engine_with(**settings: object) -> tuple[ServedEngine, Aborts]:
    # A small KV cache keeps check_invariants (it walks every block) cheap.
    settings = {"model": "qwen2.5-0.5b", "max_model_len": 512, "num_gpu_blocks": 64, **settings}
    engine = ServedEngine(ReferenceConfig(**settings), clock=lambda: 0.0)  # type: ignore[arg-type]
    observer = Aborts()
    engine.observer = observer
    return engine, observer


def submit(engine: ServedEngine, name: str, prompt: int = 40, output: int = 30) -> TokenStream:
    stream = engine.submit(prompt, output, request_id=name, received_s=0.0)
    assert isinstance(stream, TokenStream)
    return stream


def run_steps(engine: ServedEngine, n: int) -> None:
    for _ in range(n):
        out = engine.step()
        assert out is not None
        engine.deliver(out)
        engine.core.check_invariants()


def run_to_end(engine: ServedEngine) -> None:
    while (out := engine.step()) is not None:
        engine.deliver(out)
        engine.core.check_invariants()


def test_abort_a_running_request_frees_its_blocks() -> None:
    engine, observer = engine_with(block_size=16)
    a, b = submit(engine, "a"), submit(engine, "b")
    run_steps(engine, 5)  # prefill, then 4 decode steps: 40 + 4 tokens computed, 3 blocks
    assert len(a.request.block_ids) == 3 and a.num_tokens == 5
    used = engine.core.blocks.num_used_blocks
    assert engine.abort(a)
    assert engine.core.blocks.num_used_blocks == used - 3
    assert a.done and a.error == "aborted" and a.request.status is RequestStatus.FINISHED
    assert a.request.block_ids == [] and engine.num_running == 1
    engine.core.check_invariants()
    assert observer.aborted == [("a", 5)]
    assert not engine.abort(a)  # once
    run_to_end(engine)
    assert b.done and b.error is None and b.num_tokens == 30
    assert observer.finished == ["b"] and engine.core.blocks.num_used_blocks == 0


def test_abort_a_pending_request_before_it_reaches_the_scheduler() -> None:
    engine, observer = engine_with()
    late = engine.submit(40, 30, request_id="late", received_s=100.0)
    assert isinstance(late, TokenStream) and engine.num_pending == 1
    assert engine.abort(late)
    assert engine.num_pending == 0 and engine.step() is None
    assert observer.aborted == [("late", 0)]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_abort_a_waiting_request(policy: str) -> None:
    engine, observer = engine_with(max_num_seqs=1, policy=policy)
    first, second, third = (submit(engine, n) for n in ("first", "second", "third"))
    run_steps(engine, 2)
    assert engine.num_running == 1 and len(engine.core.scheduler.waiting) == 2
    assert engine.abort(second)
    assert [r.request_id for r in engine.core.scheduler.waiting] == ["third"]
    engine.core.check_invariants()
    run_to_end(engine)
    assert first.num_tokens == third.num_tokens == 30 and second.num_tokens == 0
    assert observer.aborted == [("second", 0)]


def test_abort_a_swapped_out_request_frees_its_host_blocks() -> None:
    # Two requests that outgrow 10 blocks of 16 tokens (7 each): the later one is swapped out.
    engine, _ = engine_with(num_gpu_blocks=10, preemption="swap", block_size=16)
    blocks = engine.core.blocks
    first, second = submit(engine, "first", 40, 60), submit(engine, "second", 40, 60)
    for _ in range(200):  # until the swap (bounded)
        run_steps(engine, 1)
        if second.request.status is RequestStatus.SWAPPED:
            break
    assert second.request.status is RequestStatus.SWAPPED
    assert blocks.num_free_host_blocks < blocks.num_host_blocks
    assert engine.abort(second)
    assert blocks.num_free_host_blocks == blocks.num_host_blocks
    engine.core.check_invariants()
    run_to_end(engine)
    assert first.num_tokens == 60 and blocks.num_used_blocks == 0


def test_abort_between_a_step_and_its_delivery() -> None:
    engine, observer = engine_with()
    short, long = submit(engine, "short", 40, 2), submit(engine, "long", 40, 30)
    run_steps(engine, 1)
    out = engine.step()  # short's last token and long's second, not yet released
    assert out is not None and "short" in out.finished_request_ids
    assert not engine.abort(short)  # it finished in that step: delivery ends it normally
    assert engine.abort(long)  # its token of that step is dropped
    engine.deliver(out)
    engine.core.check_invariants()
    assert short.done and short.error is None and short.num_tokens == 2
    assert long.num_tokens == 1
    assert observer.finished == ["short"] and observer.aborted == [("long", 1)]
    assert engine.step() is None and engine.core.blocks.num_used_blocks == 0


def test_a_stream_open_at_shutdown_ends_with_an_error_event_not_a_cut() -> None:
    """Stopping the server while a long stream runs: its client reads the engine's error event
    and [DONE] (OpenAI) before the connection closes, rather than a cut mid-token."""
    import threading

    import httpx

    from harness.serve.app import start_server_in_thread

    config = ReferenceConfig(model="llama-3.1-70b", gpu="a100-80gb", tp=4)  # ~23 ms a step
    lines: list[str] = []
    started = threading.Event()
    with start_server_in_thread(config) as server:

        def read() -> None:
            with httpx.stream("POST", server.url + "/v1/completions", trust_env=False,
                              timeout=30, json={"prompt": "hi", "max_tokens": 5000,
                                                "stream": True}) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    started.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert started.wait(30)
    reader.join(30)  # the server stopped: the stream has ended
    assert not reader.is_alive()
    events = [ln for ln in lines if ln.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert '"message":"the server is shutting down"' in events[-2]
    assert 1 < len(events) < 5000  # cut short by the shutdown, not run to its end
