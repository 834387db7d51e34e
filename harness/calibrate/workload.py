"""The designed calibration workload: its phases and their requests, as traces."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

# Every request is sent at least this long after the replay's warm-up request and after the
# previous response on the connection: a keep-alive connection reused within ~40 ms of the
# previous exchange stalls the next response by ~40 ms (measured on uvicorn servers, vLLM's
# and the served reference's alike), which would pass for front-end latency.
SEND_GAP_S = 0.1


@dataclass(frozen=True, slots=True)
class Phase:
    """One part of the calibration workload, replayed on its own against the same server.

    Open loop: requests are sent at their ``arrival_s``. A phase with ``spaced_by`` gets its
    arrivals after that (earlier) phase ran: one request at a time, each sent once the
    previous one has surely finished (``space_arrivals``), so each meets an idle engine.
    """

    name: str
    requests: tuple[TraceRequest, ...]
    measures: str  # what it isolates, for the profile's metadata
    concurrency: int | None = None  # closed loop with this many users (None: open loop)
    spaced_by: str | None = None  # the phase whose durations space this one's arrivals
    first_token_samples: bool = False  # its TTFTs are idle-engine samples
    steps_used: bool = True  # its decode steps are samples


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Sizes of the calibration workload; every length fits ``max_model_len`` and the step
    budget, and every batch fits ``max_num_seqs``."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_output_tokens: int = 48  # decode steps per burst: enough for a stable median
    short_prompt_tokens: int = 32
    long_prompt_tokens: int = 512  # capped by max_model_len
    max_batch_size: int = 256  # batch sizes 1, 2, 4, ... up to min(this, max_num_seqs)
    max_prefill_tokens: int = 4096  # the prefill ladder's top (capped by the budgets)
    num_repeats: int = 3  # of each prefill length (first-token samples are noisy)

    def validate(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                     "num_output_tokens", "short_prompt_tokens", "long_prompt_tokens",
                     "max_batch_size", "max_prefill_tokens", "num_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"calibration workload: {name} must be a positive integer, "
                                 f"got {value!r}")
        if self.num_output_tokens < 8:
            raise ValueError("calibration workload: num_output_tokens must be >= 8")
        if self.max_model_len < self.short_prompt_tokens + self.num_output_tokens:
            raise ValueError(
                f"calibration workload: max_model_len {self.max_model_len} leaves no room for a "
                f"{self.short_prompt_tokens}-token prompt and {self.num_output_tokens} output "
                "tokens")

    def batch_sizes(self) -> list[int]:
        top = min(self.max_num_seqs, self.max_batch_size)
        sizes = [1]
        while sizes[-1] * 2 <= top:
            sizes.append(sizes[-1] * 2)
        if sizes[-1] != top:
            sizes.append(top)
        return sizes

    def prefill_lengths(self) -> list[int]:
        top = min(self.max_prefill_tokens, self.max_num_batched_tokens, self.max_model_len - 4)
        lengths = [16]
        while lengths[-1] * 2 <= top:
            lengths.append(lengths[-1] * 2)
        if lengths[-1] != top and top > 16:
            lengths.append(top)
        return lengths


def design_workload(spec: WorkloadSpec) -> tuple[Phase, ...]:
    """The phases, in the order they run.

    - ``pilot``: the prefill ladder once, one user: warms the engine up and times each
      length, to space the next phase (its own numbers are not used).
    - ``prefill``: the ladder (prompts 16, 32, ... up to the step budget) 3 times, 4 output
      tokens, one request at a time on an idle engine: its TTFT is the front end plus one
      prefill step (the prefill cost per token, the front-end latency); its next tokens are
      decode steps of one sequence.
    - ``decode-cN``: N requests at once with short prompts: after their prefills, N sequences
      decode together for ``num_output_tokens`` steps (the cost per running sequence).
    - ``decode-long-cN``: the same with long prompts at two batch sizes (the cost per KV
      token at equal batch sizes).
    """
    spec.validate()
    n_out = spec.num_output_tokens
    short = spec.short_prompt_tokens
    long_ = min(spec.long_prompt_tokens, spec.max_model_len - n_out)
    ladder = spec.prefill_lengths()
    pilot = tuple(TraceRequest(f"pilot-{p}", 0.0, p, 4) for p in ladder)
    prefill = tuple(TraceRequest(f"prefill-{p}-{k}", 0.0, p, 4)
                    for k in range(spec.num_repeats) for p in ladder)
    phases = [
        Phase("pilot", pilot, "warm-up; times the prefill phase's requests", concurrency=1,
              steps_used=False),
        Phase("prefill", prefill, "prefill cost per token; front-end latency",
              spaced_by="pilot", first_token_samples=True),
    ]
    sizes = spec.batch_sizes()
    for c in sizes:
        phases.append(Phase(f"decode-c{c}", burst(f"decode-c{c}", c, short, n_out),
                            f"decode steps of {c} sequences, short contexts"))
    if long_ > 2 * short:
        for c in sorted({sizes[len(sizes) // 2], sizes[-1]}):
            phases.append(Phase(f"decode-long-c{c}", burst(f"decode-long-c{c}", c, long_, n_out),
                                f"decode steps of {c} sequences, {long_}-token contexts"))
    return tuple(phases)


def burst(name: str, n: int, prompt: int, output: int) -> tuple[TraceRequest, ...]:
    """``n`` like requests sent together, ``SEND_GAP_S`` into the replay: one decode burst."""
    return tuple(TraceRequest(f"{name}-{i}", SEND_GAP_S, prompt, output) for i in range(n))


def space_arrivals(phase: Phase, timed: Sequence[RequestTimeline]) -> Phase:
    """``phase`` with one request at a time: each sent 1.5x its prompt length's longest
    end-to-end time in ``timed`` (plus ``SEND_GAP_S``) after the previous one, so that the
    previous one has finished (the engine is idle) and its connection has rested."""
    e2e: dict[int, float] = {}
    for tl in timed:
        if tl.ok:
            e2e[tl.num_prompt_tokens] = max(e2e.get(tl.num_prompt_tokens, 0.0), tl.e2e_s())
    fallback = max(e2e.values(), default=1.0)
    t = SEND_GAP_S
    spaced = []
    for r in phase.requests:
        spaced.append(replace(r, arrival_s=t))
        t += 1.5 * e2e.get(r.num_prompt_tokens, fallback) + SEND_GAP_S
    return replace(phase, requests=tuple(spaced))


def phase_trace(phase: Phase) -> Trace:
    text = repr([(r.request_id, r.num_prompt_tokens, r.num_output_tokens)
                 for r in phase.requests])
    return Trace(requests=phase.requests, source=f"calibration:{phase.name}",
                 format="synthetic", digest=hashlib.sha256(text.encode()).hexdigest())
