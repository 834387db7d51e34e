"""The reference scheduler: decides what each step computes. Plain Python, no clock, no I/O.

There is no "prefill phase" and "decode phase": each step gives every scheduled request some
of the tokens it has not computed yet (``num_tokens - num_computed_tokens``, see request.py),
within two budgets: ``max_num_seqs`` running requests and ``max_num_batched_tokens`` tokens.

    schedule():
      1. running requests, in order. A request that cannot get the KV blocks it needs makes
         room by preempting a victim (fcfs: the latest running request; priority: the worst
         (priority, arrival)); if the victim is the request itself it stops the pass.
      2. waiting requests, head first, while both budgets last -- unless this step preempted
         (as vLLM V1: freed blocks go to the preempted requests first).
    update_from_output(): each request advances by the tokens it was given; one that caught
      up samples a token; one that reached max_output_tokens finishes and frees its blocks.

Policies change only the queue order, the victim and (static) when admission is open.
Admission "optimistic" allocates blocks as tokens grow and may preempt (recompute: blocks
freed, progress reset; swap: blocks moved to host, progress kept). Admission "reserve"
allocates prompt + max output at admission and never preempts.

Prefix caching (``SchedulerConfig.prefix_caching``) changes admission only: a request admitted
with no progress starts at the tokens of its prompt blocks found in the cache (the block
manager's ``find_cached_prefix``) and is given the rest.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from adapters.reference.blocks import BlockManager, InvariantError, PrefixHit
from adapters.reference.config import SchedulerConfig
from adapters.reference.request import Request, RequestStatus

# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What one step computes; the executor costs it, ``update_from_output`` applies it."""

    # Scheduled requests (running ones first, then newly admitted) and the tokens each
    # computes this step; the two tuples have the same length and order.
    requests: tuple[Request, ...]
    num_new_tokens: tuple[int, ...]
    num_prefill_tokens: int  # tokens of requests still computing their prompt (or recompute)
    num_decode_tokens: int  # one per request feeding back its last sampled token
    num_padded_tokens: int  # static batching: padding computed and thrown away
    num_padded_seqs: int  # static batching: empty batch slots still stepped
    num_kv_tokens: int  # sum of (computed + new): the KV the step reads and writes
    num_attention_pairs: int  # sum of causal (query, key) pairs the attention computes
    preempted_request_ids: tuple[str, ...]
    num_swapped_out_blocks: int
    num_swapped_in_blocks: int
    num_running: int  # after this step's scheduling
    num_waiting: int
    num_kv_blocks_used: int

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_cost_tokens(self) -> int:
        """Tokens the hardware computes, padding included."""
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_padded_tokens

    @property
    def num_cost_seqs(self) -> int:
        return len(self.requests) + self.num_padded_seqs

    @property
    def num_swapped_blocks(self) -> int:
        return self.num_swapped_out_blocks + self.num_swapped_in_blocks

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass(frozen=True, slots=True)
class ExecutorOutput:
    """What the executor reports back: how long the step took."""

    duration_s: float


@dataclass(frozen=True, slots=True)
class StepOutput:
    """The effect of one step, for whoever streams tokens (a live server) or records them."""

    start_s: float
    end_s: float
    token_request_ids: tuple[str, ...]  # requests that produced one token at end_s
    finished_request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DecodeSpan:
    """The next steps are pure decode of the same requests, with nothing admitted or preempted.

    Then step j (0-based) computes ``num_seqs`` tokens over ``num_kv_tokens + num_seqs*(j+1)``
    KV tokens and needs ``num_new_blocks_by_offset[j % block_size]`` new blocks (optimistic
    admission; empty when everything is reserved). See ``Scheduler.decode_span``.
    """

    num_seqs: int
    num_padded_seqs: int
    num_kv_tokens: int  # sum of num_computed_tokens before the span
    max_steps: int  # the first request finishes at this step
    num_new_blocks_by_offset: tuple[int, ...]
    num_free_blocks: int
    num_used_blocks: int
    num_waiting: int


# ---------------------------------------------------------------- waiting queues


class FcfsQueue:
    """Arrival order; preempted requests go back to the front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        self._queue.appendleft(request)

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue:
    """Lowest (priority, arrival, index) first; a preempted request re-enters by the same key."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, float, int], Request]] = []

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.sort_key, request))

    prepend = add

    def remove(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[1] is not request]
        heapq.heapify(self._heap)

    def peek(self) -> Request:
        return self._heap[0][1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (request for _, request in self._heap)


# ---------------------------------------------------------------- scheduler


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.blocks = block_manager
        if config.prefix_caching:
            block_manager.enable_prefix_caching()
        self.waiting: FcfsQueue | PriorityQueue = (
            PriorityQueue() if config.policy == "priority" else FcfsQueue())
        self.running: list[Request] = []
        self.reserve = config.admission == "reserve"
        # reserve admission: one token more than a request ever holds (SchedulerConfig doc)
        self.reserve_extra = 1 if config.reserve_last_token else 0
        self.static = config.policy == "static"
        self.num_static_slots = 0  # static: size of the batch being run
        self.num_preemptions = 0
        self.num_swap_fallbacks = 0  # swap preemptions recomputed: host swap space was full
        # the end instant of every step applied so far, by step index: a request's token
        # instants are the ends of the steps its ``token_steps`` name (``token_times_s``)
        self.step_end_s: list[float] = []

    # ---- requests in

    def add_request(self, request: Request) -> bool:
        """Queue ``request``; False (and the request marked rejected) if it can never run."""
        reason = self._rejection(request)
        if reason:
            request.status = RequestStatus.REJECTED
            request.error_kind = "rejected"
            request.error_message = reason
            return False
        request.status = RequestStatus.WAITING
        self.waiting.add(request)
        return True

    def _rejection(self, r: Request) -> str:
        return self.rejection(r.num_prompt_tokens, r.max_output_tokens)

    def rejection(self, num_prompt_tokens: int, max_output_tokens: int) -> str:
        """Why a request of these sizes can never run ('' when it can): rejected at arrival
        (by ``add_request``; the served engine asks before it accepts one)."""
        if num_prompt_tokens < 1 or max_output_tokens < 1:
            return "a request needs at least one prompt token and one output token"
        max_len = self.config.max_model_len
        if num_prompt_tokens + max_output_tokens > max_len:
            return (f"prompt ({num_prompt_tokens}) + output ({max_output_tokens}) tokens "
                    f"exceed max_model_len ({max_len})")
        num_max_kv_tokens = num_prompt_tokens + max_output_tokens - 1  # Request's
        if not self.config.chunked_prefill:  # a prefill runs whole in one step
            budget = self.config.max_num_batched_tokens
            if num_prompt_tokens > budget:
                return (f"prompt ({num_prompt_tokens}) tokens exceed max_num_batched_tokens "
                        f"({budget}): with chunked prefill off a prompt is prefilled whole in "
                        "one step")
            # recompute (and swap, which falls back to it when the host is full); reserve
            # admission (the static policy's too) never preempts
            if (self.config.preemption != "none" and self.config.admission != "reserve"
                    and num_max_kv_tokens > budget):
                return (f"prompt ({num_prompt_tokens}) + output ({max_output_tokens}) "
                        f"tokens exceed max_num_batched_tokens ({budget}): with chunked "
                        "prefill off, a request preempted late would re-prefill them whole in "
                        "one step")
        need = self.blocks.blocks_for(num_max_kv_tokens + (self.reserve_extra if self.reserve
                                                            else 0))
        if need > self.blocks.num_gpu_blocks:
            return (f"needs {need} KV blocks even alone, but the KV cache has only "
                    f"{self.blocks.num_gpu_blocks}")
        return ""

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def abort(self, request_id: str) -> Request | None:
        """End a queued or running request between steps, its blocks freed as a finished
        one's; the request (``error_kind`` "aborted"), or None when none has that id."""
        request = next((r for r in self.running if r.request_id == request_id), None)
        if request is not None:
            self.running.remove(request)
        else:
            request = next((r for r in self.waiting if r.request_id == request_id), None)
            if request is None:
                return None
            self.waiting.remove(request)
        self.blocks.free(request)
        request.status = RequestStatus.FINISHED
        request.error_kind = "aborted"
        request.error_message = "aborted"
        return request

    # ---- one step

    def schedule(self) -> SchedulerOutput:
        cfg, blocks, running = self.config, self.blocks, self.running
        budget = cfg.max_num_batched_tokens
        scheduled: list[Request] = []
        num_new: list[int] = []
        preempted: list[Request] = []
        num_swapped_out = 0

        # 1. Running requests first; preempt victims until each one's blocks fit.
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            while blocks.allocate(request, n) is None:
                victim = self._victim()
                num_swapped_out += self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
                if victim in scheduled:  # priority: the victim may be already scheduled
                    k = scheduled.index(victim)
                    budget += num_new.pop(k)
                    scheduled.pop(k)
                    i -= 1
            if request.status is not RequestStatus.RUNNING:
                break  # it was its own victim: nothing more fits this step
            scheduled.append(request)
            num_new.append(n)
            budget -= n
            i += 1

        # 2. Then waiting requests, unless this step preempted.
        num_swapped_in = num_padded = 0
        if not preempted and self.waiting:
            if self.static:
                num_padded = self._admit_static_batch(scheduled, num_new, budget)
            else:
                num_swapped_in = self._admit_waiting(scheduled, num_new, budget)

        return self._output(scheduled, num_new, preempted, num_swapped_out, num_swapped_in,
                            num_padded)

    def _admit_waiting(self, scheduled: list[Request], num_new: list[int], budget: int) -> int:
        """Admit waiting requests head first while budgets and blocks last; swapped-in blocks."""
        cfg, running, waiting = self.config, self.running, self.waiting
        num_swapped_in = 0
        while waiting and len(running) < cfg.max_num_seqs and budget > 0:
            request = waiting.peek()
            hit = self.blocks.find_cached_prefix(request)  # NO_HIT unless prefix caching is on
            n = request.num_tokens - request.num_computed_tokens - hit.num_tokens
            if n > budget:
                if not cfg.chunked_prefill:
                    break  # a prompt is prefilled whole; keep arrival order (vLLM)
                n = budget
            num_host = request.num_host_blocks
            if self._admission_blocks(request, n, hit) is None:
                break
            waiting.pop()
            request.num_computed_tokens += hit.num_tokens  # cached KV: no compute
            request.status = RequestStatus.RUNNING
            running.append(request)
            scheduled.append(request)
            num_new.append(n)
            budget -= n
            num_swapped_in += num_host
        return num_swapped_in

    def _reserved_tokens(self, request: Request) -> int:
        """The KV tokens reserve admission holds for ``request`` from admission on."""
        return request.num_max_kv_tokens + self.reserve_extra

    def _admission_blocks(self, request: Request, n: int, hit: PrefixHit) -> list[int] | None:
        if self.reserve:
            return self.blocks.reserve(request, self._reserved_tokens(request), n, hit)
        if request.num_host_blocks:
            return self.blocks.swap_in(request, n)
        return self.blocks.allocate(request, n, hit)

    def _admit_static_batch(self, scheduled: list[Request], num_new: list[int], budget: int) -> int:
        """Static: between batches only, take prompts padded to the longest; padded tokens."""
        if self.running:
            return 0
        cfg, waiting = self.config, self.waiting
        longest = 0
        while waiting and len(self.running) < cfg.max_num_seqs:
            request = waiting.peek()
            hit = self.blocks.find_cached_prefix(request)
            n = request.num_tokens - request.num_computed_tokens - hit.num_tokens
            padded_len = max(longest, n)
            if padded_len * (len(self.running) + 1) > budget:
                break
            if self.blocks.reserve(request, self._reserved_tokens(request), n, hit) is None:
                break
            waiting.pop()
            request.num_computed_tokens += hit.num_tokens
            longest = padded_len
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(request)
            num_new.append(n)
        self.num_static_slots = len(self.running)
        return longest * len(scheduled) - sum(num_new)

    def _victim(self) -> Request:
        """fcfs: the latest running request; priority: the worst (priority, arrival)."""
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: r.sort_key)
        return self.running[-1]

    def _preempt(self, victim: Request) -> int:
        """Evict ``victim``'s KV from the GPU and queue it again; the blocks swapped out."""
        if self.reserve:
            raise InvariantError("reserve admission ran out of blocks for a running request")
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        num_swapped = None
        if self.config.preemption == "swap":
            num_swapped = self.blocks.swap_out(victim)  # None: host full, recompute instead
            if num_swapped is None:
                self.num_swap_fallbacks += 1
        if num_swapped is None:
            self.blocks.free(victim)
            victim.num_computed_tokens = 0  # recompute: prompt + generated tokens again
            victim.status = RequestStatus.WAITING
        else:
            victim.status = RequestStatus.SWAPPED
        self.waiting.prepend(victim)
        return num_swapped or 0

    def _output(self, scheduled: list[Request], num_new: list[int], preempted: list[Request],
                num_swapped_out: int, num_swapped_in: int, num_padded: int) -> SchedulerOutput:
        num_prefill = num_decode = num_kv = num_pairs = 0
        for request, n in zip(scheduled, num_new, strict=True):
            computed = request.num_computed_tokens
            if n == 1 and request.num_output_tokens and computed + 1 == request.num_tokens:
                num_decode += 1
            else:
                num_prefill += n
            num_kv += computed + n
            num_pairs += n * computed + n * (n + 1) // 2
        num_padded_seqs = 0
        if self.static:
            # Padding: prompts padded to the longest (attention too); empty slots still step.
            num_padded_seqs = self.num_static_slots - len(scheduled) if scheduled else 0
            if num_padded:
                longest = max(r.num_tokens - r.num_computed_tokens for r in scheduled)
                num_kv += num_padded
                num_pairs = len(scheduled) * (longest * (longest + 1) // 2)
            num_padded += num_padded_seqs
        return SchedulerOutput(
            requests=tuple(scheduled),
            num_new_tokens=tuple(num_new),
            num_prefill_tokens=num_prefill,
            num_decode_tokens=num_decode,
            num_padded_tokens=num_padded,
            num_padded_seqs=num_padded_seqs,
            num_kv_tokens=num_kv,
            num_attention_pairs=num_pairs,
            preempted_request_ids=tuple(r.request_id for r in preempted),
            num_swapped_out_blocks=num_swapped_out,
            num_swapped_in_blocks=num_swapped_in,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_kv_blocks_used=self.blocks.num_used_blocks,
        )

    def update_from_output(self, out: SchedulerOutput, executor_output: ExecutorOutput,
                           start_s: float) -> StepOutput:
        """Apply a step that started at ``start_s``: progress, sampled tokens, finishes."""
        end_s = start_s + executor_output.duration_s
        step = len(self.step_end_s)
        self.step_end_s.append(end_s)
        produced: list[str] = []
        finished: list[Request] = []
        for request, n in zip(out.requests, out.num_new_tokens, strict=True):
            if request.first_scheduled_s is None:
                request.first_scheduled_s = start_s
            request.num_computed_tokens += n
            if request.num_computed_tokens == request.num_tokens:  # caught up: sample a token
                request.num_output_tokens += 1
                runs = request.token_steps
                if runs and runs[-2] + runs[-1] == step:  # the run goes on
                    runs[-1] += 1
                else:
                    runs += (step, 1)
                produced.append(request.request_id)
                if request.num_output_tokens >= request.max_output_tokens:
                    finished.append(request)
        for request in finished:
            self._finish(request, end_s)
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return StepOutput(start_s, end_s, tuple(produced), tuple(r.request_id for r in finished))

    def token_times_s(self, request: Request) -> list[float]:
        """The instant each of ``request``'s output tokens was sampled: the ends of the steps
        its ``token_steps`` name."""
        ends, runs = self.step_end_s, request.token_steps
        return [t for i in range(0, len(runs), 2) for t in ends[runs[i]:runs[i] + runs[i + 1]]]

    def _finish(self, request: Request, end_s: float) -> None:
        request.status = RequestStatus.FINISHED
        request.finished_s = end_s
        self.blocks.free(request)

    # ---- pure-decode spans (a simulation shortcut with identical results)

    def decode_span(self) -> DecodeSpan | None:
        """Describe the coming pure-decode steps, or None when the next step is anything else.

        Pure decode: every running request feeds back its last token, and no waiting request
        can be admitted in any of those steps (admission conditions only get harder while free
        blocks shrink). The caller stops before a step that needs more blocks than are free
        (there the full scheduler would preempt) and before any arrival.
        """
        running = self.running
        if not running:
            return None
        num_kv = 0
        max_steps = 1 << 62
        bs = self.blocks.block_size
        counts = [0] * bs
        for r in running:
            computed = r.num_computed_tokens
            num_out = r.num_output_tokens
            # The last prompt token is a prefill token, as in ``_output``: no span before it.
            if num_out == 0 or r.num_prompt_tokens + num_out - computed != 1:
                return None
            num_kv += computed
            counts[-computed % bs] += 1
            if r.max_output_tokens - num_out < max_steps:
                max_steps = r.max_output_tokens - num_out
        if self.waiting and not self._admission_closed(len(running)):
            return None
        by_offset = () if self.reserve else tuple(counts)
        return DecodeSpan(
            num_seqs=len(running),
            num_padded_seqs=self.num_static_slots - len(running) if self.static else 0,
            num_kv_tokens=num_kv,
            max_steps=max_steps,
            num_new_blocks_by_offset=by_offset,
            num_free_blocks=self.blocks.num_free_blocks,
            num_used_blocks=self.blocks.num_used_blocks,
            num_waiting=len(self.waiting),
        )

    def _admission_closed(self, num_decoding: int) -> bool:
        """True when the waiting head cannot be admitted now, nor while free blocks only shrink.

        Prefix caching: decode steps may evict the head's cached-free hit blocks, so its hit
        only shrinks, down to its leading run of held blocks. Each check takes the easiest
        case: the budget the largest hit, the blocks that run plus every held hit block.
        """
        cfg, blocks = self.config, self.blocks
        if self.static or len(self.running) >= cfg.max_num_seqs:
            return True
        budget = cfg.max_num_batched_tokens - num_decoding
        if budget <= 0:
            return True
        head = self.waiting.peek()
        start = head.num_computed_tokens
        hit = blocks.find_cached_prefix(head)
        if not cfg.chunked_prefill and head.num_tokens - start - hit.num_tokens > budget:
            return True
        num_held = blocks.num_held_blocks(hit.block_ids) if hit.block_ids else 0
        if hit.block_ids:
            hit = blocks.find_cached_prefix(head, held_only=True)
        tokens = self._reserved_tokens(head) if self.reserve else min(
            head.num_tokens, start + hit.num_tokens + budget)
        return blocks.blocks_for(tokens) - num_held > blocks.num_free_blocks

    def advance_decode_span(self, end_times_s: list[float]) -> list[Request]:
        """Apply ``len(end_times_s)`` pure-decode steps of a ``decode_span``; the finished ones."""
        k = len(end_times_s)
        if not self.reserve and not self.blocks.allocate_all(self.running, k):
            raise InvariantError("a decode span ran past the free blocks")
        finished: list[Request] = []
        first = len(self.step_end_s)
        self.step_end_s.extend(end_times_s)
        for request in self.running:
            request.num_computed_tokens += k
            request.num_output_tokens += k
            runs = request.token_steps
            if runs[-2] + runs[-1] == first:  # every one sampled a token the step before
                runs[-1] += k
            else:
                runs += (first, k)
            if request.num_output_tokens >= request.max_output_tokens:
                finished.append(request)
        for request in finished:
            self._finish(request, end_times_s[-1])
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return finished

    # ---- invariants

    def check_invariants(self) -> None:
        """Queues, statuses and block holdings agree; raises InvariantError otherwise."""
        running_ids = {id(r) for r in self.running}
        waiting = list(self.waiting)
        if len(running_ids) != len(self.running):
            raise InvariantError("a request is listed twice in running")
        if any(id(r) in running_ids for r in waiting):
            raise InvariantError("a request is both waiting and running")
        if len(self.running) > self.config.max_num_seqs:
            raise InvariantError(f"{len(self.running)} running > max_num_seqs")
        bs = self.blocks.block_size
        for r in self.running:
            expected = self.blocks.blocks_for(
                self._reserved_tokens(r) if self.reserve else r.num_computed_tokens)
            if r.status is not RequestStatus.RUNNING or len(r.block_ids) != expected:
                raise InvariantError(f"running {r!r}: expected {expected} blocks (block_size {bs})")
            if not 0 <= r.num_computed_tokens <= r.num_tokens or r.num_host_blocks:
                raise InvariantError(f"running {r!r}: inconsistent progress")
            if r.num_output_tokens >= r.max_output_tokens:
                raise InvariantError(f"running {r!r}: should have finished")
            if sum(r.token_steps[1::2]) != r.num_output_tokens or (
                    r.token_steps and r.token_steps[-2] + r.token_steps[-1] > len(self.step_end_s)):
                raise InvariantError(f"running {r!r}: its token steps {r.token_steps} do not "
                                     "name one step per output token")
            if self.blocks.prefix_caching and r.num_cached_blocks != min(
                    r.num_computed_tokens // bs, len(r.block_hashes)):
                raise InvariantError(f"running {r!r}: offered {r.num_cached_blocks} blocks to "
                                     "the prefix cache, not its computed full prompt blocks")
        for r in waiting:
            if r.block_ids:
                raise InvariantError(f"waiting {r!r} holds GPU blocks")
            if r.status is RequestStatus.SWAPPED:
                if r.num_host_blocks != self.blocks.blocks_for(r.num_computed_tokens):
                    raise InvariantError(f"swapped {r!r}: host blocks do not match its tokens")
            elif r.status is not RequestStatus.WAITING or r.num_computed_tokens:
                raise InvariantError(f"waiting {r!r}: expected no progress")
        self.blocks.check_invariants([*self.running, *waiting])
