"""A live engine that ran with prefix caching on, from which no prefix-cache counter was read
(it exports none, or was not scraped): the report's prefix-cache section lists such cells with
hit rates not known, rather than leaving them out (or the section, when every cell is live)."""

from __future__ import annotations

from pathlib import Path

from harness.report.runs import CellResult
from harness.report.sections import prefix_cache_section

SIMULATED_CACHE = {"queries_tokens": 1000, "hits_tokens": 250, "hit_rate": 0.25,
                   "preempted_hit_rate": None, "num_requests_with_prefix_ids": 10}


def _cell(name: str, kind: str, *, caching: bool, summary: dict[str, object] | None = None
          ) -> CellResult:
    return CellResult(name=name, run_dir=Path(name), state="done", summary=summary or {},
                      manifest={"kind": kind, "knobs": {"prefix_caching": caching}})


def test_a_live_cell_with_caching_on_is_listed_as_not_read() -> None:
    lines = prefix_cache_section([
        _cell("sim", "simulated", caching=True, summary={"prefix_cache": SIMULATED_CACHE}),
        _cell("vllm", "live", caching=True), _cell("off", "live", caching=False)])
    text = "\n".join(lines)
    assert "| `sim` | 1,000 | 250 | 25.0% | – |" in text
    assert "| `vllm` | not read | not read | – | – |" in text
    assert "`off`" not in text  # no caching: nothing to know
    assert ("`vllm` ran with prefix caching on a live engine from which no prefix-cache "
            "counter was read") in text


def test_only_live_cells_with_caching_still_get_the_section() -> None:
    text = "\n".join(prefix_cache_section([_cell("vllm", "live", caching=True)]))
    assert text.startswith("## Prefix cache") and "their hit rates are not known" in text
    assert prefix_cache_section([_cell("vllm", "live", caching=False)]) == []


def test_no_finding_of_zero_tokens_skipped_when_the_trace_names_no_prefix() -> None:
    from harness.report.findings import _prefix_cache_finding

    blind = {**SIMULATED_CACHE, "hits_tokens": 0, "hit_rate": 0.0}
    unknown = {**blind, "num_requests_with_prefix_ids": None}  # a summary from before the count
    for cache in ({**blind, "num_requests_with_prefix_ids": 0}, unknown):
        assert _prefix_cache_finding(
            [_cell("c", "live", caching=True, summary={"prefix_cache": cache})]) == []
    hit = _prefix_cache_finding([_cell("c", "live", caching=True, summary={
        "prefix_cache": {**SIMULATED_CACHE, "num_requests_with_prefix_ids": None}})])
    assert hit and hit[0].startswith("Prefill the prefix cache skipped: `c` 250 prompt tokens")
