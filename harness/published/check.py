"""Check every published row against the reference engine under its profile; render the table.

``check_rows`` simulates each row (in parallel processes) with the shipped profile of its engine
and GPU; ``render_text`` prints it for ``batchlab check-published``; ``render_fidelity`` writes
docs/fidelity.md. The document carries a digest of its inputs (the measurements and the
profiles), so a test can tell it is stale without simulating anything.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adapters.reference.cost_model import PROFILES_DIR
from harness.prediction import KINDS
from harness.published.fit import DONORS, HELD_OUT_SOURCES
from harness.published.profiles import EngineProfile
from harness.published.replay import LENGTH_SHAPES, RowPrediction, predict_row, predict_shipped
from harness.published.rows import INVERSE_METRICS, MEASUREMENTS_CSV, PublishedRow, load_rows
from harness.published.sensitivity import (
    UNPUBLISHED_WORKLOAD,
    LengthSensitivity,
    render_sensitivity,
    workload_published,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
FIDELITY_MD = REPO_ROOT / "docs" / "fidelity.md"
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.25


# Why rows of each source miss: rendered into docs/fidelity.md, next to the numbers.
SOURCE_NOTES = {
    "trtllm-perf-v0.17": (
        "Offline max throughput from `trtllm-bench`, which sizes `max_batch_size` and "
        "`max_num_tokens` from the data set (values not published; the profile's defaults are "
        "used). Rows whose batch is bounded by KV space (long outputs, 70B on one or two GPUs) "
        "depend on the KV budget, and the reference counts TensorRT-LLM's 0.95 of *free* memory "
        "as 0.95 of total."),
    "trtllm-perf-v1.0": (
        "Same benchmark a year later on the PyTorch backend, never seen by the fit: it measures "
        "how well the 0.17-era coefficients carry over to a newer engine."),
    "trtllm-perf-online-v0.14": (
        "Triton streaming server. Latencies are published in whole milliseconds (ITL 7 ms is "
        "+-7%). At high request rates the published ITL grows faster than predicted: each "
        "running request costs the Triton front end something per token that the offline "
        "rows of the same profile do not have. The data set of the 202/214 rows is not named; "
        "202/214 are the means of the first 500 requests of vLLM's ShareGPT sampler (201.8/"
        "213.9), which they are simulated as."),
    "vllm-blog-v0.6.0": (
        "Bar heights read from the charts (+-1%). vLLM 0.6.0 (V0 engine, multi-step "
        "scheduling) is held out against a profile fitted on vLLM 0.19 (V1): the error "
        "includes a year of engine changes. TensorRT-LLM r24.07 on Llama-3-8B decode-heavy "
        "(20.8 req/s, below vLLM's 31 and below the same engine's own 0.14 serving table) "
        "cannot be matched by a profile that fits TensorRT-LLM's own tables. ShareGPT rows "
        "replay the 500 requests of vLLM's ShareGPT sampler (seed 0), whose longest requests "
        "set the run's duration; the blog's mean output, 179 tokens, is below the sample's "
        "214 (runs stopped at end of sequence), and which requests stopped early is not "
        "published: see the ShareGPT table below."),
    "vllm-blog-fp8kv": (
        "The only vLLM V1 source with fixed workloads: it trains the vLLM profile. Lengths "
        "vary +-15% around 20k/2k; the single-request rows come from the post's linear fit."),
    "vllm-ci-perf-9515": (
        "H200 rows simulated with the H100-fitted vLLM coefficients (no H200 training rows). "
        "The throughput test replays 200 ShareGPT prompts of vLLM's sampler with every output "
        "at its sampled length; the page gives no lengths, so the default seed is assumed. "
        "The 8B latency test "
        "(batch 8) takes 6.5 ms a step on the H200, what the same engine takes at batch 1 on "
        "an H100: the H200's extra memory bandwidth is not reached at this batch size, and the "
        "borrowed coefficients assume it is."),
    "nim-llama-3.3-70b-1.8.0": (
        "NIM's engine settings and request counts are not published (10 x C assumed). The "
        "figures are steady-state windows (`window` steady): at C = 50 the first 50 requests "
        "alone need at least ~17 s of prefill, a mean TTFT of 8 s or more among them, which "
        "would put a whole-run mean above the published 0.83 s. The closed loop is simulated "
        "(the capacity planner's); with every request the same length the simulated users fall "
        "into step with the 5000-token prefill steps at low C, and TTFT at C = 5 comes out "
        "1.35x the published value: each new request waits for one whole prefill. The fit's "
        "emulated loop, measured over the whole run, gave 0.90x, 1.31x and 2.15x at C = 5, 25 "
        "and 50."),
    "tgi-v3-overview": (
        "Cannot be fitted, and is kept to show it: the figures are wall-clock durations of "
        "k6 runs (non-streaming chat requests, a chat template, outputs that may stop before "
        "50 tokens), dominated for the small scenario by client and HTTP time the reference "
        "does not model. Their error is that of the throughput a duration implies (a "
        "duration predicted at 27% of the published one is a throughput 3.7 times too "
        "high, +269%): the worst held-out rows, and all four predicted high. There is no "
        "TGI training data: the TGI profile borrows vLLM's coefficients, so these rows test "
        "TGI's scheduling defaults only."),
}


@dataclass(frozen=True)
class CheckedRow:
    row: PublishedRow
    prediction: RowPrediction
    held_out: bool

    @property
    def split(self) -> str:
        return "held-out" if self.held_out else "train"

    @property
    def error(self) -> float:
        """The signed error, in the terms of the row's kind of figure: predicted / published
        - 1, but for a run's duration (a fixed amount of work, filed as throughput) the error
        of the throughput it implies, published / predicted - 1: a run predicted to take 27%
        of its published time is a throughput 3.7 times too high (+269%), not a 73% miss."""
        ratio = self.prediction.ratio
        return 1.0 / ratio - 1.0 if self.row.metric in INVERSE_METRICS else ratio - 1.0

    @property
    def abs_error(self) -> float:
        return abs(self.error)


@dataclass(frozen=True)
class ErrorStats:
    num_rows: int
    median_abs_error: float
    worst_abs_error: float
    worst_row_id: str
    num_within_target: int  # |error| <= TARGET_WORST
    # the sources the rows come from (source ids): how broad the basis of the error is
    sources: tuple[str, ...] = ()
    # rows predicted above the published figure (``CheckedRow.error`` > 0): a bias, when most
    # rows err the same way, that a median |error| does not show
    num_over: int = 0

    def as_dict(self) -> dict[str, object]:
        """As stored in a profile. Six decimals: shown as a percentage with one decimal, a
        value rounded to four first could print a tenth away from the same statistic in
        docs/fidelity.md (0.052534 stored as 0.0525 prints 5.2%, not 5.3%)."""
        return {"num_rows": self.num_rows, "median_abs_error": round(self.median_abs_error, 6),
                "worst_abs_error": round(self.worst_abs_error, 6),
                "worst_row_id": self.worst_row_id, "sources": list(self.sources),
                "num_over": self.num_over}


def error_stats(checked: Iterable[CheckedRow]) -> ErrorStats | None:
    items = [c for c in checked if math.isfinite(c.abs_error)]
    if not items:
        return None
    errors = np.array([c.abs_error for c in items])
    worst = items[int(np.argmax(errors))]
    return ErrorStats(len(items), float(np.median(errors)), float(errors.max()),
                      worst.row.row_id, int((errors <= TARGET_WORST).sum()),
                      tuple(sorted({c.row.source_id for c in items})),
                      sum(c.error > 0 for c in items))


def stats_by_kind(checked: Iterable[CheckedRow]) -> dict[str, ErrorStats]:
    """``error_stats`` of each kind of figure (``harness.prediction.KINDS`` order) that has
    rows."""
    items = list(checked)
    out = {}
    for kind in KINDS:
        stats = error_stats(c for c in items if c.row.kind == kind)
        if stats is not None:
            out[kind] = stats
    return out


def check_rows(rows: Sequence[PublishedRow], *, jobs: int | None = None,
               profile: EngineProfile | None = None, catalog: bool = False
               ) -> list[CheckedRow]:
    """Simulate ``rows`` (each with its own shipped profile, or all with ``profile``;
    ``catalog``: each with its shipped profile's engine defaults and the catalog's
    coefficients, ``harness.published.catalog``)."""
    if profile is not None:
        predictions = [predict_row(r, profile) for r in rows]
    else:
        predictions = predict_shipped([(r, LENGTH_SHAPES[0]) for r in rows], jobs=jobs,
                                      catalog=catalog)
    return [CheckedRow(r, p, r.source_id in HELD_OUT_SOURCES)
            for r, p in zip(rows, predictions, strict=True)]


def inputs_digest(csv_path: Path = MEASUREMENTS_CSV, profiles_dir: Path = PROFILES_DIR) -> str:
    """sha256 (first 16 hex digits) of the measurements and every shipped profile."""
    h = hashlib.sha256(csv_path.read_bytes())
    for path in sorted(profiles_dir.glob("*.json")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "nan"
    return f"{x:.4g}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def stats_lines(checked: Sequence[CheckedRow]) -> list[str]:
    lines = []
    for label, held, every in (("train", False, True), ("held-out", True, True),
                               ("held-out, workload published", True, False)):
        s = error_stats(c for c in checked if c.held_out == held
                        and (every or workload_published(c.row)))
        if s is None:
            lines.append(f"{label}: no rows")
            continue
        lines.append(f"{label}: {s.num_rows} rows, median |error| {_pct(s.median_abs_error)}, "
                     f"worst {_pct(s.worst_abs_error)} ({s.worst_row_id}), "
                     f"{s.num_within_target} within {_pct(TARGET_WORST)}")
    for kind, s in stats_by_kind(c for c in checked if c.held_out).items():
        lines.append(f"  held-out {kind}: {s.num_rows} rows, median |error| "
                     f"{_pct(s.median_abs_error)}, worst {_pct(s.worst_abs_error)} "
                     f"({s.worst_row_id}), {s.num_over} predicted high")
    return lines


def render_text(checked: Sequence[CheckedRow]) -> str:
    """The table ``batchlab check-published`` prints."""
    width = max((len(c.row.row_id) for c in checked), default=6)
    out = [f"{'row':<{width}}  {'metric':<12} {'published':>10} {'predicted':>10} "
           f"{'ratio':>6} {'error':>8}  split"]
    for c in checked:
        p = c.prediction
        out.append(f"{c.row.row_id:<{width}}  {c.row.metric:<12} {_fmt(p.published):>10} "
                   f"{_fmt(p.predicted):>10} {p.ratio:>6.3f} {c.error:>+8.1%}  {c.split}")
    out.append("")
    out.append("ratio: predicted / published; error: ratio - 1, but for a run's duration "
               "(a fixed amount of work) the error of the throughput it implies, 1 / ratio - 1")
    out.extend(stats_lines(checked))
    return "\n".join(out)


def render_fidelity(checked: Sequence[CheckedRow], digest: str | None = None,
                    sensitivity: Sequence[LengthSensitivity] = ()) -> str:
    """docs/fidelity.md: how well each shipped profile predicts the published rows
    (``sensitivity``: harness.published.sensitivity.length_sensitivity of the same rows)."""
    digest = digest or inputs_digest()
    lines = [
        "# Fidelity against published measurements",
        "",
        "<!-- generated by `batchlab check-published --write-docs`; do not edit by hand -->",
        f"<!-- inputs digest: {digest} -->",
        "",
        "Each row of `harness/data/published/measurements.csv` (sources and terms in",
        "`harness/data/published/README.md`) is replayed on the reference engine with the shipped",
        "profile of its engine and GPU (`adapters/reference/profiles/<engine>-<gpu>.json`); how",
        "the workloads are built and the profiles fitted is in docs/published.md. *Train* rows",
        "come from sources the fit saw; *held-out* rows from sources it never saw",
        f"({', '.join(f'`{s}`' for s in HELD_OUT_SOURCES)}). Error = predicted / published - 1;",
        "for a run's duration (a fixed amount of work, a throughput figure) the error of the",
        "throughput it implies, published / predicted - 1. *Predicted high* counts the rows",
        "predicted above the published figure: when most rows of a kind are, the model is",
        "biased that way (optimistic for throughput, pessimistic for latency).",
        f"Target: held-out median |error| <= {_pct(TARGET_MEDIAN)}, none worse than "
        f"{_pct(TARGET_WORST)}.",
        "",
        "Some rows' workloads are only partly published ("
        + "; ".join(f"{k}: {v}" for k, v in UNPUBLISHED_WORKLOAD.items())
        + "). They stay in every statistic; the rows *workload published* leave them out, "
        "so that the model's error can be told from the workload's (the rule looks at the "
        "data set only, never at the error).",
        "",
        "## Summary",
        "",
        "| rows | count | median abs. error | worst abs. error | worst row | within 25% "
        "| predicted high |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    groups: list[tuple[str, list[CheckedRow]]] = [
        ("train", [c for c in checked if not c.held_out]),
        ("held-out", [c for c in checked if c.held_out]),
        ("train, workload published",
         [c for c in checked if not c.held_out and workload_published(c.row)]),
        ("held-out, workload published",
         [c for c in checked if c.held_out and workload_published(c.row)]),
    ]
    for name in dict.fromkeys(c.row.profile_name for c in checked):
        for split in ("train", "held-out"):
            groups.append((f"{name}, {split}", [c for c in checked if c.row.profile_name == name
                                                  and c.split == split]))
    for label, items in groups:
        s = error_stats(items)
        if s is not None:
            lines.append(f"| {label} | {s.num_rows} | {_pct(s.median_abs_error)} | "
                         f"{_pct(s.worst_abs_error)} | `{s.worst_row_id}` | "
                         f"{s.num_within_target} | {s.num_over} |")
    lines += ["", "## By kind of figure", "",
              "A report states a predicted number's accuracy for its kind: throughput (output "
              "tokens/s, requests/s and run durations), TTFT, TPOT/ITL or E2E.", "",
              "| rows | kind | count | median abs. error | worst abs. error | worst row | "
              "predicted high |",
              "|---|---|---:|---:|---:|---|---:|"]
    kind_groups = groups[:2] + [  # train and held-out, then each profile's held-out rows
        (f"{name}, held-out", [c for c in checked if c.row.profile_name == name
                               and c.held_out])
        for name in dict.fromkeys(c.row.profile_name for c in checked)]
    for label, items in kind_groups:
        for kind, s in stats_by_kind(items).items():
            lines.append(f"| {label} | {kind} | {s.num_rows} | {_pct(s.median_abs_error)} | "
                         f"{_pct(s.worst_abs_error)} | `{s.worst_row_id}` | {s.num_over} |")
    lines += ["", "## By source", "",
              "| source | split | rows | median abs. error | worst abs. error |",
              "|---|---|---:|---:|---:|"]
    for source in dict.fromkeys(c.row.source_id for c in checked):
        items = [c for c in checked if c.row.source_id == source]
        s = error_stats(items)
        if s is not None:
            lines.append(f"| `{source}` | {items[0].split} | {s.num_rows} | "
                         f"{_pct(s.median_abs_error)} | {_pct(s.worst_abs_error)} |")
    lines += ["", "## Where and why rows miss", ""]
    for source in dict.fromkeys(c.row.source_id for c in checked):
        if source in SOURCE_NOTES:
            lines += [f"* `{source}`: {SOURCE_NOTES[source]}"]
    lines += ["", "Profiles without training rows borrow coefficients: "
              + ", ".join(f"`{k}` from `{v}`" for k, v in DONORS.items())
              + "; and profiles without tensor-parallel training rows take the all-reduce "
              "latency fitted for TensorRT-LLM on the same GPU (docs/published.md).", ""]
    sens = render_sensitivity(sensitivity, {c.row.row_id for c in checked if c.held_out})
    if sens:
        lines += [*sens, ""]
    lines += ["## Every row", "",
              "| row | profile | metric | published | predicted | ratio | split | workload |",
              "|---|---|---|---:|---:|---:|---|---|"]
    for c in checked:
        p = c.prediction
        workload = "published" if workload_published(c.row) else "partly unpublished"
        lines.append(f"| `{c.row.row_id}` | {c.row.profile_name} | {c.row.metric} | "
                     f"{_fmt(p.published)} | {_fmt(p.predicted)} | {p.ratio:.3f} | {c.split} | "
                     f"{workload} |")
    return "\n".join(lines) + "\n"


def fidelity_digest(text: str) -> str | None:
    """The inputs digest a rendered docs/fidelity.md was made from."""
    for line in text.splitlines():
        if line.startswith("<!-- inputs digest: "):
            return line.removeprefix("<!-- inputs digest: ").removesuffix(" -->").strip()
    return None


def check_all(jobs: int | None = None) -> list[CheckedRow]:
    return check_rows(load_rows(), jobs=jobs)
