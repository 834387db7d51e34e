"""The chunk instants (``chunk_times``) and per-request metrics (``request_metric_columns``)
gathered once for the tables and the summary give what each computes on its own: the same
summary, the same tables."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from adapters.reference import ReferenceConfig
from harness.metrics import (
    Slo,
    chunk_gaps_s,
    chunk_times,
    pooled_gaps_s,
    request_metric_columns,
    run_duration_s,
    summarize,
    token_gaps_s,
)
from harness.results import chunks_table, requests_table
from harness.sim import simulate
from harness.timeline import OneTokenChunks, RequestTimeline, StepInstants
from harness.traces import TraceOptions, load_trace

TRACE = "harness/data/azure_conv_excerpt.csv"


def _timelines() -> list[RequestTimeline]:
    """Finished, failed part-way, never started and multi-token-chunk requests, mixed."""
    out = []
    for i in range(30):
        arrival = 0.1 * i
        n = 3 + i % 5
        times = tuple(arrival + 0.02 + 0.01 * k for k in range(n))
        if i % 7 == 3:  # failed after two chunks
            out.append(RequestTimeline(f"r{i}", arrival, 50, n, priority=i % 2,
                                       chunk_times_s=times[:2], chunk_num_tokens=(1, 1),
                                       error_kind="stream_cut"))
        elif i % 7 == 5:  # never started
            out.append(RequestTimeline(f"r{i}", arrival, 50, n, priority=i % 2,
                                       error_kind="not_finished"))
        else:
            # some chunks of two tokens: after the first, or only the first
            counts = (1,) * n if i % 3 else (1, *(2,) * (n - 1)) if i % 2 else (2, *(1,) * (n - 1))
            out.append(RequestTimeline(f"r{i}", arrival, 50, n, priority=i % 2,
                                       chunk_times_s=times, chunk_num_tokens=counts,
                                       finished_s=times[-1], finish_reason="length"))
    return out


def test_summary_from_shared_chunk_times_is_the_summary() -> None:
    timelines = _timelines()
    slo = Slo(ttft_s=0.05, tpot_s=0.02)
    alone = summarize(timelines, slo=slo)
    shared = summarize(timelines, slo=slo, chunks=chunk_times(timelines),
                       metrics=request_metric_columns(timelines))
    assert json.dumps(shared, sort_keys=True) == json.dumps(alone, sort_keys=True)
    assert alone["num_failed"] == 8  # failed and unstarted requests are in the mix
    assert "by_priority" in alone  # whose classes compute their own metrics


def test_tables_from_shared_chunk_times_and_metrics_are_the_tables() -> None:
    timelines = _timelines()
    assert chunks_table(timelines, chunk_times(timelines)).equals(chunks_table(timelines))
    for live in (False, True):  # (as JSON text: NaN never equals NaN in a table)
        shared = requests_table(timelines, live=live, metrics=request_metric_columns(timelines))
        alone = requests_table(timelines, live=live)
        assert shared.schema == alone.schema
        assert json.dumps(shared.to_pylist()) == json.dumps(alone.to_pylist())


def test_chunk_times_of_a_subset_are_the_subsets_chunk_times() -> None:
    timelines = _timelines()
    keep = np.array([tl.ok for tl in timelines])
    subset = [tl for tl in timelines if tl.ok]
    lengths, times = chunk_times(timelines).of(keep)
    expected = chunk_times(subset)
    assert np.array_equal(lengths, expected.lengths)
    assert np.array_equal(times, expected.times_s)
    gaps, token_gaps = pooled_gaps_s(subset, chunk_times(subset))
    alone_gaps, alone_token_gaps = pooled_gaps_s(subset)
    assert np.array_equal(gaps, alone_gaps) and np.array_equal(token_gaps, alone_token_gaps)


def test_pooled_gaps_are_every_requests_gaps_end_to_end() -> None:
    ok = [tl for tl in _timelines() if tl.ok]
    gaps, token_gaps = pooled_gaps_s(ok, chunk_times(ok))
    assert np.array_equal(gaps, np.concatenate([chunk_gaps_s(tl) for tl in ok]))
    assert np.array_equal(token_gaps, np.concatenate([token_gaps_s(tl) for tl in ok]))


def test_a_request_without_a_priority_is_counted_in_class_0() -> None:
    """Served as priority 0 (vLLM's default and the reference's): its class is 0, and every
    request is in one class."""
    timelines = [RequestTimeline(f"r{i}", float(i), 10, 2, priority=(None, 1, 2)[i % 3],
                                 chunk_times_s=(i + 0.1, i + 0.2), chunk_num_tokens=(1, 1),
                                 finished_s=i + 0.2, finish_reason="length")
                 for i in range(9)]
    summary = summarize(timelines)
    classes = summary["by_priority"]
    assert sorted(classes) == ["0", "1", "2"]
    assert sum(c["num_requests"] for c in classes.values()) == summary["num_requests"] == 9
    assert classes["0"]["num_requests"] == 3
    # no request with a priority: no classes at all
    plain = [RequestTimeline("r", 0.0, 10, 2, chunk_times_s=(0.1, 0.2), chunk_num_tokens=(1, 1),
                             finished_s=0.2, finish_reason="length")]
    assert "by_priority" not in summarize(plain)


def test_several_tokens_in_a_chunk_as_docs_metrics_says() -> None:
    """docs/metrics.md, "Several tokens in a chunk": itl_s gives the first chunk's m_1 - 1
    extra tokens no value (sum of m_j, j >= 2, values), tpot_s counts them in N - 1; a request
    whose tokens all came in one chunk, its end in the same read, has tpot_s exactly 0, which
    enters the TPOT percentiles and meets a TPOT SLO."""
    spread = RequestTimeline("a", 0.0, 10, 6, chunk_times_s=(1.0, 1.3, 1.5),
                             chunk_num_tokens=(3, 2, 1), finished_s=1.5)
    whole = RequestTimeline("b", 0.0, 10, 5, chunk_times_s=(1.0,), chunk_num_tokens=(5,),
                            finished_s=1.0)
    gaps = token_gaps_s(spread)
    assert gaps.size == 6 - 3 and np.allclose(gaps, [0.15, 0.15, 0.2])  # not 6 - 1 values
    assert np.isclose(request_metric_columns([spread])["tpot_s"][0], 0.5 / 5)
    assert token_gaps_s(whole).size == 0
    summary = summarize([spread, whole], slo=Slo(tpot_s=0.001))
    assert summary["itl_s"]["count"] == 3
    assert summary["tpot_s"]["count"] == 2 and summary["tpot_s"]["p50"] == 0.05
    assert summary["goodput"]["num_good"] == 1  # the one-chunk request, at TPOT 0


def test_one_token_chunks_are_the_tuple_of_ones_wherever_it_goes() -> None:
    """``OneTokenChunks`` (what simulation writes) equals ``(1,) * n`` and survives a pickle
    and a copy as itself; the summary and the tables of such timelines are those of the plain
    tuples, and a plain tuple that is not all ones is still read chunk by chunk."""
    ones = OneTokenChunks(4)
    assert ones == (1, 1, 1, 1) and OneTokenChunks(0) == () and len(ones) == 4
    for again in (pickle.loads(pickle.dumps(ones)), copy.copy(ones), copy.deepcopy(ones)):
        assert type(again) is OneTokenChunks and again == ones
    plain = _timelines()
    typed = [dataclasses.replace(tl, chunk_num_tokens=OneTokenChunks(len(tl.chunk_num_tokens)))
             if set(tl.chunk_num_tokens) <= {1} else tl for tl in plain]
    assert sum(type(tl.chunk_num_tokens) is OneTokenChunks for tl in typed) > 10
    assert typed == plain
    assert json.dumps(summarize(typed), sort_keys=True) == json.dumps(summarize(plain),
                                                                      sort_keys=True)
    assert chunks_table(typed).equals(chunks_table(plain))
    multi = summarize(plain)["itl_s"]["count"]
    assert multi > summarize([dataclasses.replace(tl, chunk_num_tokens=(1,) * len(
        tl.chunk_num_tokens)) for tl in plain])["itl_s"]["count"]  # the 2-token chunks count


def test_run_duration_is_from_the_first_arrival_to_the_last_event() -> None:
    """From the first arrival to the last thing that happened: a finish, a chunk of a request
    cut off (no finish), or the arrival of a request rejected on arrival, whichever is last."""
    base = _timelines()
    cut = RequestTimeline("cut", 1.0, 50, 9, chunk_times_s=(1.5, 9.5), chunk_num_tokens=(1, 1),
                          error_kind="stream_cut")
    late = RequestTimeline("late", 12.0, 50, 9, error_kind="rejected")
    for timelines, expected in ((base, max(tl.finished_s or 0.0 for tl in base)),
                                ([*base, cut], 9.5), ([*base, cut, late], 12.0)):
        assert run_duration_s(timelines) == expected
    assert run_duration_s([]) == 0.0
    assert run_duration_s([late]) == 0.0  # one instant: no time passed


def test_step_instants_are_the_tuple_of_their_steps_ends() -> None:
    """``StepInstants`` (a simulated request's chunk instants) reads the shared step ends at
    its runs of step indices and behaves as the tuple of those floats everywhere: indexing,
    slices, iteration, numpy, ==, hash; pickled and copied, it is that tuple."""
    ends = np.array([0.5, 1.0, 1.25, 2.0, 3.5, 4.0, 4.5])
    times = StepInstants(ends, (1, 2, 4, 3))  # steps 1-2, then (after a preemption) 4-6
    expected = (1.0, 1.25, 3.5, 4.0, 4.5)
    assert len(times) == 5 and times == expected and expected == times
    assert tuple(times) == expected and list(times) == list(expected)
    assert all(type(t) is float for t in times) and type(times[0]) is float
    assert (times[0], times[2], times[-1], times[-5]) == (1.0, 3.5, 4.5, 1.0)
    assert times[1:4] == (1.25, 3.5, 4.0) and times[::-1] == expected[::-1]
    for bad in (5, -6):
        with pytest.raises(IndexError):
            times[bad]
    assert np.array_equal(np.asarray(times), expected)
    assert np.asarray(times, dtype=np.float32).dtype == np.float32
    assert np.array_equal(np.diff(times), np.diff(expected))
    assert hash(times) == hash(expected) and times != expected[:-1] and times != list(expected)
    assert times == StepInstants(ends.copy(), (1, 2, 4, 3))  # another array, same values
    assert times != StepInstants(ends, (1, 3, 5, 2))
    for again in (pickle.loads(pickle.dumps(times)), copy.copy(times), copy.deepcopy(times)):
        assert again == expected
    empty = StepInstants(ends, ())
    assert not empty and len(empty) == 0 and empty == () and tuple(empty) == ()
    assert np.asarray(empty).shape == (0,)


def test_step_instants_are_gathered_as_they_are_read_one_by_one() -> None:
    """``chunk_times`` gathers the instants of many ``StepInstants`` sharing one array in
    numpy; it reads what iterating them gives, and falls back to iterating when the timelines
    mix arrays or carry plain tuples."""
    ends = np.cumsum(np.linspace(0.01, 0.05, 40))
    runs = [(0, 3), (), (2, 5, 20, 4), (39, 1), (5, 1, 7, 1, 9, 30)]
    shared = [RequestTimeline(f"r{i}", 0.0, 10, 60, chunk_times_s=StepInstants(ends, r),
                              chunk_num_tokens=OneTokenChunks(sum(r[1::2])))
              for i, r in enumerate(runs)]
    plain = [dataclasses.replace(tl, chunk_times_s=tuple(tl.chunk_times_s)) for tl in shared]
    gathered = StepInstants.gather([tl.chunk_times_s for tl in shared])
    assert gathered is not None
    assert np.array_equal(gathered, [t for tl in plain for t in tl.chunk_times_s])
    fast, slow = chunk_times(shared), chunk_times(plain)
    assert np.array_equal(fast.lengths, slow.lengths) and np.array_equal(fast.times_s,
                                                                       slow.times_s)
    assert StepInstants.gather([tl.chunk_times_s for tl in plain]) is None
    other = StepInstants(ends.copy(), (0, 2))
    assert StepInstants.gather([shared[0].chunk_times_s, other]) is None
    assert StepInstants.gather([shared[0].chunk_times_s, ()]) is not None  # empty: no chunks
    mixed = [*shared, dataclasses.replace(shared[0], chunk_times_s=other)]
    assert np.array_equal(chunk_times(mixed).times_s,
                          np.concatenate([slow.times_s, [ends[0], ends[1]]]))
    assert json.dumps(summarize(shared), sort_keys=True) == json.dumps(summarize(plain),
                                                                       sort_keys=True)
    assert _same_table(requests_table(shared), requests_table(plain))
    assert chunks_table(shared).equals(chunks_table(plain))


def test_a_simulated_run_with_preemptions_gives_what_tuples_give() -> None:
    """Requests preempted and resumed have several runs of token steps; their instants,
    summary and tables are those of the same timelines made of plain tuples."""
    trace = load_trace(TRACE, TraceOptions(limit=80, rate=8, max_model_len=2048,
                                           on_too_long="drop"))
    result = simulate(trace.requests, ReferenceConfig(
        model="llama-3.1-8b", num_gpu_blocks=200, max_num_seqs=16,
        max_num_batched_tokens=512))
    timelines = result.timelines
    assert sum(tl.num_preemptions for tl in timelines) > 0
    assert any(len(tl.chunk_times_s._runs) > 2 for tl in timelines  # type: ignore[attr-defined]
               if isinstance(tl.chunk_times_s, StepInstants))
    plain = [dataclasses.replace(tl, chunk_times_s=tuple(tl.chunk_times_s)) for tl in timelines]
    assert plain == timelines
    ends = result.steps["t_s"].to_numpy() + result.steps["duration_s"].to_numpy()
    for tl in plain:  # each instant is the end of a step, in order
        assert set(tl.chunk_times_s) <= set(ends.tolist())
        assert list(tl.chunk_times_s) == sorted(tl.chunk_times_s)
    assert np.array_equal(chunk_times(timelines).times_s, chunk_times(plain).times_s)
    assert json.dumps(summarize(timelines), sort_keys=True) == json.dumps(summarize(plain),
                                                                          sort_keys=True)
    assert chunks_table(timelines).equals(chunks_table(plain))
    assert _same_table(requests_table(timelines), requests_table(plain))


def _same_table(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, NaN equal to NaN (``Table.equals`` has NaN != NaN)."""
    if a.schema != b.schema:
        return False
    for name in a.column_names:
        x, y = a[name].to_numpy(zero_copy_only=False), b[name].to_numpy(zero_copy_only=False)
        if x.dtype.kind == "f":
            if not np.array_equal(x, y, equal_nan=True):
                return False
        elif x.tolist() != y.tolist():
            return False
    return True
