"""How much a row's prediction depends on what its source did not publish.

Two kinds of rows have a workload that is only partly published (``UNPUBLISHED_WORKLOAD``,
keyed by data set; the rule looks at the workload, never at the error):

* ShareGPT rows publish the mean prompt and output lengths, not the requests. The benchmarks
  behind them ran vLLM's ShareGPT sampler, whose draws with the default seed are bundled, so
  the requests are known up to what the source leaves out: which of them stopped early at end
  of sequence (the vLLM blog's mean output, 179 tokens, is below the sample's 214), and for
  some rows whether the default seed was kept. An offline or saturated run of a few hundred
  requests lasts until its longest requests finish, so its throughput follows the tail of the
  lengths. ``length_sensitivity`` simulates each such row under every shape of
  ``LENGTH_SHAPES`` and docs/fidelity.md shows the spread next to the published value.
* TGI's k6 rows ask for at most 50 output tokens without forcing them, so the output lengths
  are not known.

docs/fidelity.md reports the error statistics with and without these rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.published.replay import LENGTH_SHAPES, predict_shipped
from harness.published.rows import PublishedRow

UNPUBLISHED_WORKLOAD = {
    "sharegpt": "requests inferred from vLLM's sampler, early stops not published",
    "orca-first-200": "outputs not forced to max_tokens: output lengths not published",
    "govreport-20": "outputs not forced to max_tokens: output lengths not published",
}
SHAPE_LABELS = {
    "vllm-sample": "vLLM's ShareGPT sample (used)",
    "fixed": "fixed at the means",
    "sharegpt-8k": "8k-filtered ShareGPT excerpt",
    "azure-conv": "Azure conversation excerpt",
}


def workload_published(row: PublishedRow) -> bool:
    """False when part of the row's workload (see UNPUBLISHED_WORKLOAD) is not published."""
    return row.dataset not in UNPUBLISHED_WORKLOAD


@dataclass(frozen=True)
class LengthSensitivity:
    row_id: str
    profile: str
    metric: str
    published: float
    predicted: dict[str, float]  # by shape of LENGTH_SHAPES

    def ratio(self, shape: str) -> float:
        return self.predicted[shape] / self.published

    @property
    def spread(self) -> float:
        """Largest over smallest prediction across the shapes."""
        values = [v for v in self.predicted.values() if math.isfinite(v) and v > 0]
        return max(values) / min(values) if values else math.nan


def length_sensitivity(rows: Sequence[PublishedRow], *, jobs: int | None = None
                       ) -> list[LengthSensitivity]:
    """Every ShareGPT row of ``rows`` simulated under each length shape (shipped profiles)."""
    selected = [r for r in rows if r.dataset == "sharegpt"]
    work = [(r, shape) for r in selected for shape in LENGTH_SHAPES]
    values = [p.predicted for p in predict_shipped(work, jobs=jobs)] if work else []
    out = []
    for i, row in enumerate(selected):
        chunk = values[i * len(LENGTH_SHAPES):(i + 1) * len(LENGTH_SHAPES)]
        out.append(LengthSensitivity(row.row_id, row.profile_name, row.metric, row.value,
                                     dict(zip(LENGTH_SHAPES, chunk, strict=True))))
    return out


def render_sensitivity(items: Sequence[LengthSensitivity], held_out: set[str]) -> list[str]:
    """Markdown lines: one row per ShareGPT row, its ratio under each length shape."""
    if not items:
        return []
    header = " | ".join(SHAPE_LABELS[s] for s in LENGTH_SHAPES)
    lines = [
        "## ShareGPT rows: how much the unpublished lengths matter",
        "",
        "Predicted / published under four length distributions, each scaled to the row's",
        "published means (harness/published/sensitivity.py). The check uses the first. *Spread*",
        "is the largest prediction over the smallest: where it is large, the published figure",
        "cannot tell the model's error from the workload's.",
        "",
        f"| row | metric | split | {header} | spread |",
        "|---|---|---|" + "---:|" * (len(LENGTH_SHAPES) + 1),
    ]
    for s in items:
        ratios = " | ".join(f"{s.ratio(shape):.2f}" for shape in LENGTH_SHAPES)
        split = "held-out" if s.row_id in held_out else "train"
        lines.append(f"| `{s.row_id}` | {s.metric} | {split} | {ratios} | {s.spread:.2f}x |")
    return lines
