"""Engine steps recovered from streamed token timestamps, as the fit's samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.calibrate.fit import StepSample
from harness.calibrate.workload import Phase
from harness.timeline import RequestTimeline


@dataclass(slots=True)
class _Chunk:
    t_s: float
    request_index: int
    last_token_index: int  # output index of the chunk's last token (0 = the first token)
    num_tokens: int


def _cluster_threshold_s(timelines: Sequence[RequestTimeline]) -> float:
    """Chunks closer than this belong to one step: a third of the typical token gap."""
    gaps = [g for tl in timelines for g in np.diff(tl.chunk_times_s) if g > 0]
    if not gaps:
        return 0.0
    return max(0.3 * float(np.median(gaps)), 1e-4)


def decode_step_samples(timelines: Sequence[RequestTimeline], *, phase: str = "",
                        threshold_s: float | None = None) -> list[StepSample]:
    """Pure decode steps, timed between clusters of tokens that were delivered on time.

    Chunks of all requests are sorted and cut into clusters where consecutive instants are
    more than ``threshold_s`` apart (default: 0.3 x the median token gap): each cluster is one
    step's output. A cluster is *on time* when each of its chunks carries one token and the
    gaps on both sides are at least half the median gap: a server that fell behind (rendering
    /metrics, say) delivers several steps' tokens late and in a lump, and the cluster next to
    such a lump is not an instant to time anything from.

    Between two on-time clusters with the same members, each of them advanced by the same
    number of tokens D >= 1, and no other request in flight (a request waiting for its first
    token may have had an unseen prefill chunk in those steps), the engine ran D pure decode
    steps of those members. That span is one sample: its mean step duration (median over the
    members), ``num_steps`` D, and the KV tokens of the average step.
    """
    timelines = [tl for tl in timelines if tl.ok and tl.chunk_times_s]
    if not timelines:
        return []
    tau = _cluster_threshold_s(timelines) if threshold_s is None else threshold_s
    chunks: list[_Chunk] = []
    for i, tl in enumerate(timelines):
        produced = np.cumsum(np.asarray(tl.chunk_num_tokens, dtype=np.int64))
        for t, n_tok, last in zip(tl.chunk_times_s, tl.chunk_num_tokens, produced, strict=True):
            chunks.append(_Chunk(t, i, int(last) - 1, int(n_tok)))
    chunks.sort(key=lambda c: c.t_s)
    clusters: list[list[_Chunk]] = [[chunks[0]]]
    for c in chunks[1:]:
        if c.t_s - clusters[-1][-1].t_s > tau:
            clusters.append([])
        clusters[-1].append(c)
    times = np.array([np.median([c.t_s for c in cl]) for cl in clusters])
    gaps = np.diff(times)
    short = 0.5 * float(np.median(gaps)) if gaps.size else 0.0

    def on_time(k: int) -> bool:
        cl = clusters[k]
        return (all(c.num_tokens == 1 for c in cl)
                and len({c.request_index for c in cl}) == len(cl)
                and (k == 0 or gaps[k - 1] >= short)
                and (k == len(clusters) - 1 or gaps[k] >= short))

    spans = [(tl.start_s, tl.chunk_times_s[-1]) for tl in timelines]
    out: list[StepSample] = []
    anchor: dict[int, _Chunk] | None = None
    t_anchor = 0.0
    for k, cluster in enumerate(clusters):
        if not on_time(k):
            continue
        members = {c.request_index: c for c in cluster}
        t_k = float(times[k])
        if anchor is not None and set(anchor) == set(members):
            advanced = {c.last_token_index - anchor[i].last_token_index
                        for i, c in members.items()}
            others = any(i not in members and start < t_k + tau and end > t_anchor - tau
                         for i, (start, end) in enumerate(spans))
            if len(advanced) == 1 and (d := advanced.pop()) >= 1 and not others:
                durations = [c.t_s - anchor[i].t_s for i, c in members.items()]
                # KV of the average step: request i holds prompt + j tokens at the step that
                # produces its token j, for j = anchor's + 1 .. this cluster's
                kv = sum(timelines[i].num_prompt_tokens
                         + (anchor[i].last_token_index + 1 + c.last_token_index) / 2
                         for i, c in members.items())
                out.append(StepSample(
                    duration_s=float(np.median(durations)) / d, num_seqs=len(members),
                    num_tokens=len(members), num_kv_tokens=kv, num_attention_pairs=kv,
                    phase=phase, num_steps=d,
                ))
        anchor, t_anchor = members, t_k
    return out


def first_token_samples(timelines: Sequence[RequestTimeline], *,
                        phase: str = "") -> list[StepSample]:
    """TTFT of requests sent to an idle engine (nothing else in flight): front end + prefill."""
    ok = sorted((tl for tl in timelines if tl.ok and tl.chunk_times_s), key=lambda tl: tl.start_s)
    out = []
    for tl in ok:
        start, first = tl.start_s, tl.chunk_times_s[0]
        busy = any(o is not tl and o.start_s < first and (o.finished_s or math.inf) > start
                   for o in ok)
        if busy:
            continue
        p = tl.num_prompt_tokens
        out.append(StepSample(duration_s=first - start, num_seqs=1, num_tokens=p,
                              num_kv_tokens=p, num_attention_pairs=p * (p + 1) // 2,
                              includes_frontend=True, phase=phase))
    return out


def samples_from_phase(phase: Phase, timelines: Sequence[RequestTimeline]) -> list[StepSample]:
    """What a finished phase contributes to the fit."""
    out = decode_step_samples(timelines, phase=phase.name) if phase.steps_used else []
    if phase.first_token_samples:
        out += first_token_samples(timelines, phase=phase.name)
    return out
