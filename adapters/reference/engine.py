"""The reference engine's step loop.

    EngineCore.step(start_s):  schedule -> execute (the cost model says how long) -> update

``EngineCore`` knows no clock: the caller says when a step starts and gets back when it ends.
``harness.sim`` drives it on a ``VirtualClock`` (idle time jumps to the next arrival);
``harness.serve`` drives the same core on the wall clock (add requests as they arrive, sleep
each step's predicted duration, stream the tokens ``StepOutput`` lists).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from adapters.reference.blocks import BlockManager, InvariantError
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModel
from adapters.reference.request import Request
from adapters.reference.scheduler import ExecutorOutput, Scheduler, SchedulerOutput, StepOutput

STEP_COLUMNS = (
    "t_s", "duration_s", "num_running", "num_waiting", "num_prefill_tokens",
    "num_decode_tokens", "num_padded_tokens", "num_kv_blocks_used", "num_kv_blocks_total",
    "num_preempted",
)


class Executor(Protocol):
    """Runs one scheduled step. The cost model is one; a real model runner would be another."""

    def execute(self, out: SchedulerOutput) -> ExecutorOutput: ...


class CostModelExecutor:
    """Executes a step by predicting its duration with the roofline cost model."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        if out.num_cost_tokens == 0:
            # a step that only preempted (a running pass whose first request was its own
            # victim) runs no model: vLLM's model runner returns EMPTY_MODEL_RUNNER_OUTPUT
            # when no token is scheduled (vllm/v1/worker/gpu_model_runner.py execute_model);
            # a swap preemption's copy still takes its time, as vLLM V0's worker swaps the
            # blocks and returns before the model when no sequence is scheduled
            # (vllm/worker/worker_base.py execute_model: execute_worker, then
            # num_seq_groups == 0: return [])
            return ExecutorOutput(self.cost_model.swap_s(out.num_swapped_blocks))
        return ExecutorOutput(self.cost_model.step_s(
            out.num_cost_tokens, out.num_cost_seqs, out.num_kv_tokens,
            out.num_attention_pairs, out.num_swapped_blocks))


class VirtualClock:
    """Simulated seconds: advanced by each step's duration; jumps over idle periods."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def advance_to(self, t_s: float) -> None:
        if t_s < self.now_s:
            raise InvariantError(f"virtual clock would go back from {self.now_s} to {t_s}")
        self.now_s = t_s


class StepLog:
    """One row per step, kept as columns (STEP_COLUMNS)."""

    def __init__(self, num_kv_blocks_total: int) -> None:
        self.num_kv_blocks_total = num_kv_blocks_total
        # float columns (t_s, duration_s) and int columns alike; typed loosely for speed
        self.columns: dict[str, list[Any]] = {name: [] for name in STEP_COLUMNS}

    def record(self, start_s: float, duration_s: float, out: SchedulerOutput) -> None:
        c = self.columns
        c["t_s"].append(start_s)
        c["duration_s"].append(duration_s)
        c["num_running"].append(out.num_running)
        c["num_waiting"].append(out.num_waiting)
        c["num_prefill_tokens"].append(out.num_prefill_tokens)
        c["num_decode_tokens"].append(out.num_decode_tokens)
        c["num_padded_tokens"].append(out.num_padded_tokens)
        c["num_kv_blocks_used"].append(out.num_kv_blocks_used)
        c["num_kv_blocks_total"].append(self.num_kv_blocks_total)
        c["num_preempted"].append(len(out.preempted_request_ids))

    def __len__(self) -> int:
        return len(self.columns["t_s"])

    def to_table(self) -> pa.Table:
        # via numpy buffers: several times faster than pa.array on long Python lists, and
        # pa.array would import pandas (a third of a second) to check what it was given
        arrays = []
        for name, values in self.columns.items():
            floats = name in ("t_s", "duration_s")
            column = np.array(values, dtype=np.float64 if floats else np.int64)
            arrays.append(pa.Array.from_buffers(pa.float64() if floats else pa.int64(),
                                                len(column), [None, pa.py_buffer(column)]))
        return pa.Table.from_arrays(arrays, names=list(self.columns))


class EngineCore:
    """Scheduler + executor + step log for one configuration."""

    def __init__(self, config: ReferenceConfig, executor: Executor | None = None) -> None:
        self.config = config
        self.cost_model = config.cost_model()
        self.num_kv_blocks_total = config.resolved_num_gpu_blocks()
        num_host_blocks = config.num_host_blocks() if config.preemption == "swap" else 0
        self.blocks = BlockManager(self.num_kv_blocks_total, config.block_size, num_host_blocks)
        self.scheduler = Scheduler(config.scheduler_config(), self.blocks)
        self.executor: Executor = executor or CostModelExecutor(self.cost_model)
        # Decode spans reproduce step() exactly only when steps are costed by this cost model.
        self._spans_exact = isinstance(self.executor, CostModelExecutor)
        self.steps = StepLog(self.num_kv_blocks_total)
        self.num_done = 0  # finished or rejected

    def add_request(self, request: Request) -> bool:
        """Queue a request; False if it was rejected (``request.error_message`` says why)."""
        accepted = self.scheduler.add_request(request)
        if not accepted:
            self.num_done += 1
        return accepted

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, start_s: float) -> StepOutput:
        """Run one step that starts at ``start_s``; its output says when it ends."""
        out = self.scheduler.schedule()
        if out.is_empty and not out.preempted_request_ids:
            raise InvariantError(f"scheduler stalled with unfinished requests: {out!r}")
        executed = self.executor.execute(out)
        self.steps.record(start_s, executed.duration_s, out)
        result = self.scheduler.update_from_output(out, executed, start_s)
        self.num_done += len(result.finished_request_ids)
        return result

    def run_decode_span(self, start_s: float, until_s: float) -> float | None:
        """Run the coming pure-decode steps that start before ``until_s``; the end instant.

        A shortcut with results identical to calling ``step`` once per step (the same integer
        inputs reach the same cost function, the same floats are added in the same order), but
        with no per-step, per-request Python work. None when the next step is not pure decode.
        """
        span = self.scheduler.decode_span() if self._spans_exact else None
        if span is None:
            return None
        step_s = self.cost_model.step_s
        n, padded = span.num_seqs, span.num_padded_seqs
        tokens = n + padded
        kv = span.num_kv_tokens
        free, used = span.num_free_blocks, span.num_used_blocks
        by_offset = span.num_new_blocks_by_offset
        bs = len(by_offset)
        max_steps = span.max_steps
        durations: list[float] = []
        ends: list[float] = []
        used_after: list[int] = []
        t = start_s
        j = 0
        while j < max_steps and t < until_s:  # stop before an arrival is due
            if bs:
                need = by_offset[j % bs]
                if need > free:
                    break  # the full scheduler would preempt here
                free -= need
                used += need
                used_after.append(used)
            kv += n
            d = step_s(tokens, tokens, kv, kv, 0)
            durations.append(d)
            t = t + d
            ends.append(t)
            j += 1
        if not j:
            return None
        c = self.steps.columns
        c["t_s"].append(start_s)
        c["t_s"].extend(ends[:-1])
        c["duration_s"].extend(durations)
        c["num_running"].extend([n] * j)
        c["num_waiting"].extend([span.num_waiting] * j)
        c["num_prefill_tokens"].extend([0] * j)
        c["num_decode_tokens"].extend([n] * j)
        c["num_padded_tokens"].extend([padded] * j)
        c["num_kv_blocks_used"].extend(used_after if bs else [used] * j)
        c["num_kv_blocks_total"].extend([self.num_kv_blocks_total] * j)
        c["num_preempted"].extend([0] * j)
        self.num_done += len(self.scheduler.advance_decode_span(ends))
        return t

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
