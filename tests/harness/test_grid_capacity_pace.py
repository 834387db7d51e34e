"""A sweep's load grid gives a capacity at SLO only where the engine kept up: a load point
whose engine fell behind its arrivals fails, whatever its attainment.

With a loose SLO every load point met it, and the report said "≥ 16 req/s" while the same run
warned that the cells at 12 and 16 req/s fell behind (a longer trace would have turned their
backlog into missed SLOs; `batchlab capacity` found 11.3)."""

from __future__ import annotations

from harness.report.curves import CurvePoint, Series, interpolated_capacity


def point(load: float, attainment: float, behind: str | None = None) -> CurvePoint:
    return CurvePoint(cell=f"ref__rate-{load:g}", load=load, output_tokens_per_s=None,
                      tpot_p50_s=None, tpot_p90_s=None, ttft_p90_s=None,
                      attainment=attainment, behind=behind)


def test_a_load_point_that_fell_behind_is_no_capacity() -> None:
    behind = "fell behind: the engine fell behind its arrivals"
    series = Series("ref", "rate", (point(8, 1.0), point(12, 1.0, behind),
                                    point(16, 1.0, behind)))
    row = interpolated_capacity(series, 0.99)
    assert (row.capacity, row.bound) == (8, "≥")
    assert "12 met the SLO but its engine fell behind its arrivals" in row.evidence
    # a point failing its attainment is interpolated in attainment, as before
    series = Series("ref", "rate", (point(8, 1.0), point(12, 0.9)))
    row = interpolated_capacity(series, 0.99)
    assert row.bound == "=" and 8 < (row.capacity or 0) < 12
    # and every point keeping up and meeting it: at least the highest
    row = interpolated_capacity(Series("ref", "rate", (point(8, 1.0), point(12, 1.0))), 0.99)
    assert (row.capacity, row.bound) == (12, "≥")
