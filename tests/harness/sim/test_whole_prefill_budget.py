"""A step budget when prompts are prefilled whole (chunked prefill off, static batching)."""

from __future__ import annotations

from adapters.reference import ReferenceConfig
from harness.sim import simulate
from harness.traces import TraceRequest


def test_static_batches_under_reserve_admission_never_reject_for_a_preemption_that_cannot_happen(
        ) -> None:
    """Static batching reserves each request's whole KV at admission and never preempts: a
    request whose prompt fits one step runs even when prompt + output exceed the budget
    (only a preempted request would re-prefill both); a prompt over the budget is rejected
    (``oversized_prompts`` "reject", as TensorRT-LLM's static batching does)."""
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", policy="static",
                             max_num_seqs=4, max_num_batched_tokens=256, max_model_len=4096,
                             oversized_prompts="reject")
    result = simulate([TraceRequest("fits", 0.0, 200, 100), TraceRequest("long", 0.0, 300, 10)],
                      config)
    by_id = {tl.request_id: tl for tl in result.timelines}
    assert by_id["fits"].ok and by_id["fits"].output_tokens == 100
    assert by_id["long"].error_kind == "rejected"
