"""The terminal's layout of a prediction's accuracy sentence (``prediction_lines``): a clause
per line, nothing reworded."""

from __future__ import annotations

import pytest

from adapters.reference.config import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.cli.common import prediction_lines
from harness.prediction import prediction_text


def _sentence(lines: list[str]) -> str:
    """The lines joined back into the sentence they were split from."""
    text = lines[0]
    kinds: list[str] = []
    for line in lines[1:]:
        if line.startswith("    "):
            kinds.append(line[4:])
            continue
        if kinds:
            text += " " + ", ".join(kinds)
            kinds = []
        text += "; " + line[2:]
    if kinds:
        text += " " + ", ".join(kinds)
    return text


def test_each_top_level_clause_on_its_own_line() -> None:
    text = ("figures above: predicted by X; on 8 figures it missed by 2% (worst 9%; 3% (worst "
            "4%) on the 4 published, docs/f.md); all of them throughput figures: no TTFT")
    assert prediction_lines(text) == [
        "figures above: predicted by X",
        "  on 8 figures it missed by 2% (worst 9%; 3% (worst 4%) on the 4 published, "
        "docs/f.md)",
        "  all of them throughput figures: no TTFT",
    ]


def test_errors_by_kind_one_per_line() -> None:
    text = ("predicted by Y; on 9 figures it missed by 5%; by kind of figure: throughput 4% "
            "(worst 8%, a, b) of 5, TTFT 6% of 4 from one source (s1); but none is of h200")
    assert prediction_lines(text) == [
        "predicted by Y",
        "  on 9 figures it missed by 5%",
        "  by kind of figure:",
        "    throughput 4% (worst 8%, a, b) of 5",
        "    TTFT 6% of 4 from one source (s1)",
        "  but none is of h200",
    ]


def test_a_sentence_without_clauses_is_one_line() -> None:
    assert prediction_lines("predicted by Z (accuracy not recorded in this run)") == [
        "predicted by Z (accuracy not recorded in this run)"]


@pytest.mark.parametrize("config", [
    ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm"),
    ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", weights_dtype="fp8",
                    kv_cache_dtype="fp8"),
    ReferenceConfig(model="llama-3.1-70b", gpu="a100-80gb", tp=4),
], ids=["catalog", "catalog-fp8", "catalog-a100"])
def test_the_shipped_sentences_are_kept_whole(config: ReferenceConfig) -> None:
    text = prediction_text(prediction_record(config))
    lines = prediction_lines(text)
    assert len(lines) > 2 and _sentence(lines) == text
    assert lines[0].startswith("predicted by the reference engine")
    assert all(line.startswith("  ") for line in lines[1:])
