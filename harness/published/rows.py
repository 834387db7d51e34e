"""Published real-hardware measurements: ``harness/data/published/measurements.csv``.

One row is one published figure (a throughput, a TTFT, an ITL) with the workload that produced
it, so that the reference engine can replay the same workload and be compared with it.
``harness/data/published/README.md`` lists every source with its citation.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "published"
MEASUREMENTS_CSV = DATA_DIR / "measurements.csv"

ENGINES = ("vllm", "trtllm", "tgi")
# offline: every request arrives at t=0; rate: Poisson arrivals at arrival_value requests/s;
# concurrency: a closed loop of arrival_value clients (see harness/published/replay.py).
ARRIVALS = ("offline", "rate", "concurrency")
# Which requests a figure was measured over: run = all of them, from the first send to the last
# finish; steady = a closed loop's steady state, without its ramp (the first C requests) and its
# drain (the last C), the way benchmark clients with measurement windows report.
WINDOWS = ("run", "steady")
# What each metric is, in the words of harness/metrics.py (docs/metrics.md).
METRICS = {
    "output_tok_s": "output tokens per second over the run",
    "req_s": "completed requests per second over the run",
    "duration_s": "seconds from the first arrival to the last finish",
    "ttft_mean_s": "mean time to first token",
    "ttft_p50_s": "median time to first token",
    "itl_mean_s": "pooled inter-token latency, mean: sum(e2e - ttft) / sum(n - 1)",
    "itl_p50_s": "pooled inter-token latency, median",
    "tpot_mean_s": "per-request (e2e - ttft) / (n - 1), averaged over requests",
    "e2e_mean_s": "mean end-to-end latency",
}
# The kind of figure each metric is (``harness.prediction.KINDS``): a prediction's accuracy
# is stated per kind (a run's duration is the inverse of its throughput).
METRIC_KINDS = {
    "output_tok_s": "throughput",
    "req_s": "throughput",
    "duration_s": "throughput",
    "ttft_mean_s": "TTFT",
    "ttft_p50_s": "TTFT",
    "itl_mean_s": "TPOT/ITL",
    "itl_p50_s": "TPOT/ITL",
    "tpot_mean_s": "TPOT/ITL",
    "e2e_mean_s": "E2E",
}
# Metrics filed under a kind they are the inverse of: a run's duration at a fixed amount of
# work is its throughput's inverse, and its error is stated as the throughput's
# (``harness.published.check.CheckedRow.error``).
INVERSE_METRICS = frozenset({"duration_s"})
COLUMNS = (
    "row_id", "source_id", "source", "source_date", "engine", "engine_version", "gpu", "model",
    "weights_dtype", "kv_cache_dtype", "tensor_parallel_size", "input_tokens", "output_tokens",
    "dataset", "num_requests", "arrival", "arrival_value", "metric", "value", "window",
    "engine_settings", "notes",
)


class RowError(ValueError):
    """A measurement row is malformed; the message names the file, the row and the column."""


@dataclass(frozen=True, slots=True)
class PublishedRow:
    """One published figure and the workload behind it (columns of measurements.csv)."""

    row_id: str
    source_id: str
    source: str  # URL, or repository:path@commit
    source_date: str
    engine: str  # vllm | trtllm | tgi
    engine_version: str
    gpu: str  # a catalog GPU name (adapters/reference/hardware.py)
    model: str  # a catalog model name (adapters/reference/models.py)
    weights_dtype: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    input_tokens: int
    output_tokens: int
    dataset: str
    num_requests: int
    arrival: str
    arrival_value: float | None  # requests/s (rate) or clients (concurrency)
    metric: str
    value: float
    window: str  # one of WINDOWS
    # Known non-default settings of the published run, "key=value;key=value": scheduler
    # settings (max_num_seqs, max_num_batched_tokens, chunked_prefill, max_model_len,
    # gpu_memory_utilization) or cost-model fields (frontend_latency_s).
    engine_settings: str
    notes: str

    @property
    def profile_name(self) -> str:
        """The shipped profile this row is simulated with: ``<engine>-<gpu>``."""
        return f"{self.engine}-{self.gpu}"

    @property
    def kind(self) -> str:
        """Which kind of figure this row is (``METRIC_KINDS``)."""
        return METRIC_KINDS[self.metric]

    @property
    def concurrency(self) -> int | None:
        if self.arrival != "concurrency" or self.arrival_value is None:
            return None
        return int(self.arrival_value)

    def settings(self) -> dict[str, str]:
        """``engine_settings`` as a dict (values still strings)."""
        out: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in self.engine_settings.split(";"))):
            key, _, value = part.partition("=")
            out[key.strip()] = value.strip()
        return out


def load_rows(path: str | Path = MEASUREMENTS_CSV) -> list[PublishedRow]:
    """Read and validate the measurement CSV; row order is kept."""
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise RowError(f"{path}: missing columns {', '.join(missing)}")
        rows = [_parse(path, i + 2, raw) for i, raw in enumerate(reader)]
    seen: set[str] = set()
    for r in rows:
        if r.row_id in seen:
            raise RowError(f"{path}: row_id {r.row_id!r} appears twice")
        seen.add(r.row_id)
    return rows


def _parse(path: Path, line: int, raw: dict[str, str]) -> PublishedRow:
    where = f"{path}:{line}"

    def num(col: str, kind: type = int) -> int | float:
        try:
            value = kind(raw[col])
        except ValueError:
            raise RowError(f"{where}: {col} must be a number, got {raw[col]!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise RowError(f"{where}: {col} must be > 0, got {raw[col]!r}")
        return value

    for col, allowed in (("engine", ENGINES), ("arrival", ARRIVALS), ("metric", tuple(METRICS)),
                         ("window", WINDOWS)):
        if raw[col] not in allowed:
            raise RowError(f"{where}: {col} {raw[col]!r} is not one of {', '.join(allowed)}")
    if raw["window"] == "steady" and raw["arrival"] != "concurrency":
        raise RowError(f"{where}: window 'steady' needs arrival 'concurrency', got "
                       f"{raw['arrival']!r}")
    arrival_value: float | None = None
    if raw["arrival"] != "offline":
        arrival_value = float(num("arrival_value", float))
    return PublishedRow(
        row_id=raw["row_id"], source_id=raw["source_id"], source=raw["source"],
        source_date=raw["source_date"], engine=raw["engine"],
        engine_version=raw["engine_version"], gpu=raw["gpu"], model=raw["model"],
        weights_dtype=raw["weights_dtype"], kv_cache_dtype=raw["kv_cache_dtype"],
        tensor_parallel_size=int(num("tensor_parallel_size")),
        input_tokens=int(num("input_tokens")), output_tokens=int(num("output_tokens")),
        dataset=raw["dataset"], num_requests=int(num("num_requests")), arrival=raw["arrival"],
        arrival_value=arrival_value, metric=raw["metric"], value=float(num("value", float)),
        window=raw["window"], engine_settings=raw["engine_settings"],
        notes=raw["notes"],
    )


def sources(rows: Iterable[PublishedRow]) -> list[str]:
    """Source ids in order of first appearance."""
    return list(dict.fromkeys(r.source_id for r in rows))


def select(rows: Sequence[PublishedRow], *, profile: str | None = None,
           source_ids: Iterable[str] | None = None) -> list[PublishedRow]:
    """Rows of one profile (``<engine>-<gpu>``) and/or of some sources."""
    wanted = set(source_ids) if source_ids is not None else None
    return [r for r in rows
            if (profile is None or r.profile_name == profile)
            and (wanted is None or r.source_id in wanted)]
