"""``gate_wait_s`` and ``send_lag_s`` cover every request sent, as docs/metrics.md says.

Two defects: the summary's ``gate_wait_s`` was taken over the requests the gate held only (one
held request out of ten made its p50 that request's wait), and ``requests.parquet`` wrote a
send lag of 0 for a request whose send instant is unknown, which the summary leaves out.
"""

from __future__ import annotations

import math

import pytest

from harness.metrics import summarize
from harness.results import requests_table
from harness.timeline import RequestTimeline


def sent(i: int, *, held_until_s: float | None = None) -> RequestTimeline:
    start = i * 0.1 if held_until_s is None else held_until_s
    return RequestTimeline(str(i), i * 0.1, 10, 2, scheduled_s=held_until_s, sent_s=start,
                           chunk_times_s=(start + 0.05, start + 0.06),
                           chunk_num_tokens=(1, 1), finished_s=start + 0.06)


def test_gate_wait_is_over_every_request_sent() -> None:
    timelines = [sent(i) for i in range(9)] + [sent(9, held_until_s=1.4)]
    wait = summarize(timelines)["gate_wait_s"]
    assert wait["count"] == 10
    assert wait["p50"] == 0.0
    assert wait["mean"] == pytest.approx(0.05)
    assert wait["max"] == pytest.approx(0.5)


def test_no_gate_wait_without_a_held_request() -> None:
    assert "gate_wait_s" not in summarize([sent(i) for i in range(3)])


def test_an_unknown_send_instant_is_no_send_lag_in_the_table_or_the_summary() -> None:
    never_recorded = RequestTimeline("x", 0.5, 10, 2, error_kind="not_finished",
                                     token_count_source="chunks")
    timelines = [sent(0), never_recorded]
    lag = requests_table(timelines, live=True).column("send_lag_s").to_pylist()
    assert lag[0] == pytest.approx(0.0)
    assert math.isnan(lag[1])
    assert summarize(timelines)["send_lag_s"]["count"] == 1
