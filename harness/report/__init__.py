"""The comparative markdown report: ``report.md`` with PNG plots beside it.

Everything is read back from run folders (``summary.json``, ``manifest.json``, the parquet
files, and for scenario sweeps ``cell.json`` / ``status.json`` / ``scenario.json``), so a report
can be re-rendered at any time without re-running, and folders made at different times (a
simulated reference run and a live vLLM run of the same trace) can be compared.

Layout of a report::

    # title                         question, trace + digest, model, GPU, engines, SLO
    ## Key findings                 generated sentences, largest differences first
    ## Cells                        knobs per cell, mapped engine flags, approximations
    ## Latency / Throughput / ...   one table per metric family, deltas against the baseline
    ## Throughput–latency curves    each setting across its load points (curves.py)
    ## Capacity at SLO              per setting: from search.json, else interpolated
    ## Batch size                   a max_num_seqs sweep measured, the turn marked
    ## Per priority class           when classes exist
    ## Prediction fidelity          live cells against a simulated cell of the same trace
    ## Plots                        latency CDFs, engine state, throughput, batch-size sweep
    ## Reproduce                    the command, and a link to the metric definitions

``runs`` reads the folders into ``CellResult`` records (``curves`` the load curves, capacity
searches and batch-size rows); ``sections`` writes the header and the tables, ``findings`` the
key findings, ``fidelity`` the prediction fidelity, ``plots`` the
figures, all spelled by ``format``; ``render`` puts them together. The text depends only on the
results on disk (no clock, no host), so the same results give the same markdown: the golden
tests rely on it.
"""

from harness.manifest import MANIFEST_FILE
from harness.report.context import METRICS_DOC, ReportContext, scenario_context
from harness.report.fidelity import fidelity_pairs
from harness.report.findings import key_findings
from harness.report.format import (
    fmt_delta,
    fmt_int,
    fmt_number,
    fmt_pct,
    fmt_ratio,
    fmt_seconds,
    sig,
    table,
)
from harness.report.render import (
    mark_run_report_stale,
    render_comparison,
    render_markdown,
    render_run_report,
    render_scenario_report,
    write_report,
)
from harness.report.runs import (
    CELL_FILE,
    SCENARIO_FILE,
    STATUS_FILE,
    TELEMETRY_FILE,
    CellResult,
    collect,
    get,
    load_run,
    load_scenario_dir,
    read_engine_state,
)
from harness.results import REPORT_FILE

__all__ = [
    "CELL_FILE",
    "MANIFEST_FILE",
    "METRICS_DOC",
    "REPORT_FILE",
    "SCENARIO_FILE",
    "STATUS_FILE",
    "TELEMETRY_FILE",
    "CellResult",
    "ReportContext",
    "collect",
    "fidelity_pairs",
    "fmt_delta",
    "fmt_int",
    "fmt_number",
    "fmt_pct",
    "fmt_ratio",
    "fmt_seconds",
    "get",
    "key_findings",
    "load_run",
    "load_scenario_dir",
    "mark_run_report_stale",
    "read_engine_state",
    "render_comparison",
    "render_markdown",
    "render_run_report",
    "render_scenario_report",
    "scenario_context",
    "sig",
    "table",
    "write_report",
]
