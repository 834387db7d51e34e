"""Rendering a report: its markdown and plots, for a scenario, one run, or any run folders."""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from harness import columns
from harness.manifest import read_manifest
from harness.report import plots
from harness.report.context import ReportContext, difference_notes, scenario_context, slo_from
from harness.report.curves import (
    DEFAULT_TARGET,
    MIN_SWEEP_CAPS,
    Baselines,
    BatchRow,
    CapacityRow,
    Series,
    batch_rows,
    capacity_mark,
    capacity_rows,
    cell_setting,
    find_searches,
    load_series,
    unsearched_settings,
)
from harness.report.fidelity import prediction_section
from harness.report.findings import key_findings
from harness.report.format import code, display_path, short
from harness.report.predictions import derived_note, is_prediction, predicted_text
from harness.report.runs import (
    CellResult,
    chunk_tokens_binned,
    collect,
    first_arrival_s,
    get,
    knob,
    last_chunk_s,
    load_run,
    load_scenario_dir,
    preempted_requests,
    read_columns,
    read_engine_state,
    request_columns,
    series_key,
    sweep_cells,
    varying_knobs,
)
from harness.report.sections import (
    batch_size_section,
    capacity_section,
    cells_section,
    curves_section,
    failures_section,
    goodput_section,
    header,
    latency_section,
    output_length_section,
    preemption_section,
    prefix_cache_section,
    priority_section,
    reproduce_section,
    throughput_section,
)
from harness.report.side_by_side import SideBySide
from harness.results import (
    CHUNKS_FILE,
    REPORT_FILE,
    REQUESTS_FILE,
    STEPS_FILE,
    write_parquet_atomic,
)


def render_markdown(cells: Sequence[CellResult], ctx: ReportContext, out_dir: Path,
                    *, draw: bool = True, drawn: Mapping[str, bool] | None = None) -> str:
    """The report's text; draws its plots into ``out_dir`` when ``draw``. ``drawn``: run
    figures drawn already (``draw_run_figure``), by PNG name; they are not drawn again.

    The figures are drawn side by side in forked processes (``harness.report.side_by_side``)
    while this one writes the text: the run figures from the start, the figures of the cells
    together (``scenario_figures``) once their data is gathered."""
    ok = [c for c in cells if c.ok]
    drawn = drawn or {}
    figures = SideBySide()
    try:
        if draw and ok:
            out_dir.mkdir(parents=True, exist_ok=True)
            _start(figures, run_figures(ok, out_dir), drawn)
        return _markdown(cells, ok, ctx, out_dir, draw=draw, drawn=drawn, figures=figures)
    finally:
        figures.stop()  # an error, or Ctrl-C, before they were waited for


def _markdown(cells: Sequence[CellResult], ok: Sequence[CellResult], ctx: ReportContext,
              out_dir: Path, *, draw: bool, drawn: Mapping[str, bool],
              figures: SideBySide) -> str:
    # a cell that ended early (interrupted, its engine gone) has partial figures: shown, but
    # no baseline, curve point, capacity evidence or sweep point
    whole = [c for c in ok if not c.ended_early] or ok
    base = None
    if ctx.baseline is not None:
        base = next((c for c in whole if c.name == ctx.baseline), None)
    if base is None and whole:
        base = whole[0]
    preempted = preempted_requests(ok)
    series = load_series(whole)
    searches = find_searches(cells, ctx.slo)
    target = searches[0].target if searches else DEFAULT_TARGET
    capacity = capacity_rows(series, searches, target)
    unsearched = unsearched_settings(out_dir, ctx.scenario or {}, capacity)
    # the figures of the cells together are drawn side by side too, from here on
    scenario = (scenario_figures(ok, out_dir, ctx, whole=whole, capacity=capacity,
                                 target=target, load=series) if draw and ok else [])
    _start(figures, scenario, drawn)
    lines = header(cells, base, ctx)
    lines += ["## Key findings", ""]
    predicted = predicted_text(ok)
    if predicted:
        lines += [predicted, ""]
    bases = Baselines.of(ok, base)
    lines += [f"- {text}" for text in key_findings(cells, base, ctx, preempted,
                                                   capacity=capacity, target=target,
                                                   bases=bases,
                                                   num_unsearched=len(unsearched))]
    if ctx.baseline and (base is None or base.name != ctx.baseline):
        early = any(c.name == ctx.baseline for c in ok)  # results, of part of its trace
        lines.append(f"- The requested baseline {code(ctx.baseline)} "
                     + ("ended early: nothing is compared with its partial figures; "
                        if early else "has no results; ")
                     + (f"{code(base.name)} is used instead." if base else "nothing to compare."))
    lines.append("")
    lines += cells_section(cells)
    if ok:
        lines += latency_section(ok, bases)
        lines += throughput_section(ok, bases)
        lines += goodput_section(ok, bases, ctx)
        lines += _load_sections(whole, base, ctx, draw, series, capacity, target,
                                report_cells=ok, unsearched=unsearched)
        lines += preemption_section(ok, preempted)
        lines += prefix_cache_section(ok)
        lines += output_length_section(ok)
        lines += failures_section(ok)
        lines += priority_section(ok, bases, ctx)
        lines += prediction_section(ok)
    plotted = (_draw_plots(ok, out_dir, ctx, {**drawn, **figures.wait()}, whole=whole,
                           capacity=capacity, target=target, scenario=scenario)
               if draw else [])
    unread = unreadable_sources(ok) if draw else []
    if plotted or unread:
        lines += ["## Plots", ""]
        if predicted:
            lines += [predicted, ""]
        lines += [f"- {text}" for text in unread] + ([""] if unread else [])
        for alt, name in plotted:
            lines += [f"![{alt}]({name})", ""]
    lines += reproduce_section(cells, ctx, out_dir)
    return "\n".join(lines).rstrip() + "\n"


def _load_sections(ok: Sequence[CellResult], base: CellResult | None, ctx: ReportContext,
                   draw: bool, series: Sequence[Series], capacity: Sequence[CapacityRow],
                   target: float, *, report_cells: Sequence[CellResult],
                   unsearched: Sequence[str] = ()) -> list[str]:
    """Throughput–latency curves, capacity at SLO and the batch-size table, where the cells
    (or capacity searches beside them) give them. ``ok``: the cells that ran to their end;
    ``report_cells``: every cell with results (whether they mix predicted and measured ones
    decides whether a row is marked predicted)."""
    lines = curves_section(series, has_plot=draw, cells=report_cells, target=target)
    base_key = cell_setting(base) if base is not None else None
    capacity_lines = capacity_section(capacity, base_key, ctx.slo, target, cells=report_cells,
                                      unsearched=unsearched)
    if capacity and ctx.slo:
        capacity_lines += derived_note(ok, "Capacities at SLO", pace=True, slo=ctx.slo)
    lines += capacity_lines
    lines += batch_size_section(_batch_series(ok), report_cells=report_cells)
    return lines


def _batch_series(ok: Sequence[CellResult]) -> dict[str, list[BatchRow]]:
    """A batch-size sweep's rows, one series per combination of its other settings."""
    sweep = sweep_cells(ok)
    varying = varying_knobs(sweep)
    groups: dict[str, list[CellResult]] = {}
    for c in sweep:
        groups.setdefault(series_key(c, varying), []).append(c)
    return {name: batch_rows(group) for name, group in groups.items()
            if len({knob(c, "max_num_seqs") for c in group}) >= MIN_SWEEP_CAPS}


def write_report(cells: Sequence[CellResult], ctx: ReportContext, out_file: Path, *,
                 drawn: Mapping[str, bool] | None = None) -> Path:
    """Render and write ``out_file`` (atomically), plots beside it (``drawn``: see
    ``render_markdown``)."""
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(render_markdown(cells, ctx, out_file.parent, drawn=drawn), out_file)
    return out_file


def _write_atomic(text: str, out_file: Path) -> None:
    """A reader sees the old file or the new one, never part of one."""
    tmp = out_file.with_name(out_file.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out_file)


def _predicted_runs(runs: Mapping[str, Path]) -> list[str]:
    """The predicted runs among ``runs``, by name: a simulated run (it has steps.parquet,
    written before any file a figure is drawn from) or a replay of the served reference
    engine."""
    return [name for name, run_dir in runs.items()
            if (run_dir / STEPS_FILE).exists() or is_prediction(read_manifest(run_dir))]


def _figure_note(runs: Mapping[str, Path]) -> str | None:
    """What a figure drawn from ``runs`` says of itself when any is a prediction."""
    return _predicted_words(_predicted_runs(runs), list(runs))


def _legend_labels(runs: Mapping[str, Path]) -> dict[str, str]:
    """Each run's line in a figure's legend, by name: its name, and " (predicted)" after a
    predicted run's when the figure mixes predicted and measured runs (a wholly predicted
    figure's note says so once)."""
    return _marked(_predicted_runs(runs), list(runs))


def _marked(predicted: Sequence[str], names: Sequence[str]) -> dict[str, str]:
    """``names``, each with " (predicted)" after it when it is among ``predicted`` and some
    of ``names`` are not."""
    mixed = 0 < len(set(predicted)) < len(set(names))
    return {n: n + (" (predicted)" if mixed and n in predicted else "") for n in names}


def _predicted_words(predicted: Sequence[str], names: Sequence[str]) -> str | None:
    if not predicted:
        return None
    if len(predicted) == len(names):
        return "predicted by batchlab's reference engine, not measured"
    return "predicted by batchlab's reference engine: " + ", ".join(predicted)


def _latency_figure(runs: Mapping[str, Path], path: Path) -> bool:
    latencies = {}
    labels = _legend_labels(runs)
    for name, run_dir in runs.items():
        cols = request_columns(run_dir)
        latencies[labels[name]] = {m: cols[m] for m, _ in plots.LATENCY_PANELS if m in cols}
    return plots.latency_cdfs(latencies, path, note=_figure_note(runs)) is not None


def _engine_state_figure(runs: Mapping[str, Path], path: Path) -> bool:
    labels = _legend_labels(runs)
    states = {labels[name]: dataclasses.replace(s, t_s=s.t_s - first_arrival_s(run_dir))
              for name, run_dir in runs.items()
              if (s := read_engine_state(run_dir)) is not None}
    return bool(states) and plots.engine_state(states, path,
                                               note=_figure_note(runs)) is not None


def _throughput_figure(runs: Mapping[str, Path], path: Path) -> bool:
    # each run's clock from its first arrival to its last token; the figure's slices of time
    # end at the latest of them, and each run's chunks are then read a batch at a time
    spans: dict[str, tuple[float, float]] = {}
    for name, run_dir in runs.items():
        last = last_chunk_s(run_dir / CHUNKS_FILE)
        if last is not None:
            origin = first_arrival_s(run_dir)
            spans[name] = (origin, last - origin)
    if not spans:
        return False
    edges = plots.token_bin_edges(max(last for _, last in spans.values()))
    labels = _legend_labels(runs)
    tput = {}
    for name, (origin, last) in spans.items():
        counts = chunk_tokens_binned(runs[name] / CHUNKS_FILE, origin, edges)
        if counts is not None:
            tput[labels[name]] = plots.TokenRate(counts, last)
    return bool(tput) and plots.throughput_over_time(tput, edges, path,
                                                     note=_figure_note(runs)) is not None


@dataclass(frozen=True, slots=True)
class RunFigure:
    """A figure drawn from the runs' own files: one line per run (cell), by cell name."""

    png: str
    alt: str
    source: str  # the file of a simulated run folder its lines are drawn from
    draw: Callable[[Mapping[str, Path], Path], bool]  # (runs, PNG path) -> anything drawn
    # the last of the files it reads that a simulated run writes (the time axes start at the
    # run's first arrival, from requests.parquet, written after steps.parquet): drawn early
    # once that one is on disk
    ready: str = ""

    @property
    def drawn_after(self) -> str:
        return self.ready or self.source


RUN_FIGURES = (
    RunFigure("latency_cdf.png", "Latency CDFs (TTFT, TPOT, E2E) per cell", REQUESTS_FILE,
              _latency_figure),
    RunFigure("engine_state.png", "Running batch size, waiting queue and KV usage over time",
              STEPS_FILE, _engine_state_figure, ready=REQUESTS_FILE),
    RunFigure("throughput.png", "Output tokens per second over time", CHUNKS_FILE,
              _throughput_figure),
)


def run_figures_after(written: str) -> tuple[str, ...]:
    """The run figures (PNG names) that need no file a simulated run writes after
    ``written``: those ``draw_run_figure`` can draw once it is on disk."""
    return tuple(f.png for f in RUN_FIGURES if f.drawn_after == written)


def draw_run_figure(run_dir: Path, png: str) -> bool:
    """Draw one figure of the single run in ``run_dir`` (``run_figures_after``), before the
    rest of the folder is on disk: the figure of ``render_run_report`` exactly (pass what was
    drawn as its ``drawn``, {PNG name: this answer}). Whether there was anything to draw."""
    figure = next(f for f in RUN_FIGURES if f.png == png)
    return figure.draw({Path(run_dir).name: Path(run_dir)}, Path(run_dir) / png)


def unreadable_sources(ok: Sequence[CellResult]) -> list[str]:
    """A run figure leaves out a cell whose file it is drawn from is there but unreadable (a
    truncated parquet file): say which, rather than let a line go missing without a word."""
    out = []
    for figure in RUN_FIGURES:
        for c in ok:
            path = c.run_dir / figure.source
            if not path.exists():
                continue
            try:
                pq.ParquetFile(path).close()
            except (OSError, ValueError) as exc:
                out.append(f"{code(c.name)} is left out of `{figure.png}`: its "
                           f"`{figure.source}` is unreadable ({short(str(exc))})")
    # the time axes start at each run's first arrival, read from requests.parquet: a run
    # whose file is unreadable keeps its lines, on its own clock
    for c in ok:
        timed = [f.png for f in RUN_FIGURES if f.source != REQUESTS_FILE
                 and (c.run_dir / f.source).exists()]
        requests = c.run_dir / REQUESTS_FILE
        if not timed or not requests.exists():
            continue
        try:
            pq.ParquetFile(requests).close()
        except (OSError, ValueError):
            out.append(f"{code(c.name)}'s lines in {' and '.join(f'`{p}`' for p in timed)} "
                       f"count time from its clock's start, not its first arrival: its "
                       f"`{REQUESTS_FILE}` is unreadable")
    return out


def _draw_plots(ok: Sequence[CellResult], out_dir: Path, ctx: ReportContext,
                drawn: Mapping[str, bool], *, whole: Sequence[CellResult],
                capacity: Sequence[CapacityRow] = (), target: float = DEFAULT_TARGET,
                scenario: Sequence[ReadyFigure] | None = None) -> list[tuple[str, str]]:
    """Draw every plot there is data for (but those in ``drawn``); return (alt text, file
    name) in report order. ``whole``: the cells that ran to their end, the only points of
    the sweep and load-curve plots. ``scenario``: ``scenario_figures`` of the same cells,
    when the caller has them already."""
    plotted: list[tuple[str, str]] = []
    if not ok:
        return plotted
    out_dir.mkdir(parents=True, exist_ok=True)
    if scenario is None:
        scenario = scenario_figures(ok, out_dir, ctx, whole=whole, capacity=capacity,
                                    target=target)
    for figure in (*run_figures(ok, out_dir), *scenario):
        done = drawn.get(figure.png)
        if done is None:  # its process failed: drawn again here, where its error is raised
            done = figure.draw()
        if done:
            plotted.append((figure.alt, figure.png))
    return plotted


@dataclass(frozen=True)
class ReadyFigure:
    """A figure of the report with its data chosen: ``draw()`` draws ``png`` into the
    report's folder, and says whether there was anything to draw."""

    png: str
    alt: str
    draw: Callable[[], bool]


def run_figures(ok: Sequence[CellResult], out_dir: Path) -> list[ReadyFigure]:
    """The run figures (``RUN_FIGURES``) of the cells ``ok``, each a line per cell."""
    runs = {c.name: c.run_dir for c in ok}
    return [ReadyFigure(f.png, f.alt, functools.partial(f.draw, runs, out_dir / f.png))
            for f in RUN_FIGURES]


def _start(figures: SideBySide, ready: Sequence[ReadyFigure], drawn: Mapping[str, bool]
           ) -> None:
    """Start drawing each of ``ready`` side by side (``figures``) but those ``drawn``."""
    for figure in ready:
        if figure.png not in drawn:
            figures.start(figure.png, figure.draw)


def scenario_figures(ok: Sequence[CellResult], out_dir: Path, ctx: ReportContext, *,
                     whole: Sequence[CellResult], capacity: Sequence[CapacityRow] = (),
                     target: float = DEFAULT_TARGET, load: Sequence[Series] | None = None
                     ) -> list[ReadyFigure]:
    """The figures of the cells together that there is data for, in report order, ready to
    draw (``_draw_plots``, or side by side while the text is written). ``load``:
    ``load_series(whole)``, when the caller has it already."""
    figures: list[ReadyFigure] = []
    sweep = sweep_cells(whole)
    if sweep:
        varying = varying_knobs(sweep)
        series = {c.name: series_key(c, varying) for c in sweep}
        if len(set(series.values())) == 1:
            series = dict.fromkeys(series, "")
        lines = [key for key in set(series.values())  # a series needs two caps to be a line
                 if len({knob(c, "max_num_seqs") for c in sweep if series[c.name] == key}) >= 2]
        sweep = [c for c in sweep if series[c.name] in lines]
        # a line of predicted cells, in a figure that mixes them with measured ones, says so
        # in its legend ("TPOT p50 (fcfs, predicted)"; a line of both kinds cannot)
        predicted = [key for key in lines
                     if all(is_prediction(c.manifest) for c in sweep if series[c.name] == key)]
        mixed = 0 < len(predicted) < len(lines)
        legend = {key: (f"{key}, predicted" if key else "predicted")
                  if mixed and key in predicted else key for key in lines}
        points = [plots.SweepPoint(
            series=legend[series[c.name]],
            max_num_seqs=int(knob(c, "max_num_seqs")),
            tpot_p50_s=get(c.summary, "tpot_s.p50"), tpot_p90_s=get(c.summary, "tpot_s.p90"),
            output_tokens_per_s=get(c.summary, "throughput.output_tokens_per_s"),
        ) for c in sweep]
        tpot_slo = (ctx.slo or {}).get("tpot_s")
        note = _predicted_words([c.name for c in sweep if is_prediction(c.manifest)],
                                [c.name for c in sweep])
        figures.append(ReadyFigure(
            "batch_size.png", "TPOT and throughput against max_num_seqs",
            _drew(functools.partial(plots.batch_size_sweep, points, out_dir / "batch_size.png",
                                    tpot_slo_s=tpot_slo, note=note))))
    by_name = {c.name: c for c in ok}
    load = load_series(whole) if load is None else load
    legend = _marked([s.key for s in load
                      if all(p.cell in by_name and is_prediction(by_name[p.cell].manifest)
                             for p in s.points)], [s.key for s in load])
    rows = {r.key: r for r in capacity}
    curves = [plots.CurveLine(
        label=legend[s.key], loads=[p.load for p in s.points],
        output_tokens_per_s=[p.output_tokens_per_s for p in s.points],
        tpot_p50_s=[p.tpot_p50_s for p in s.points], tpot_p90_s=[p.tpot_p90_s for p in s.points],
        ttft_p90_s=[p.ttft_p90_s for p in s.points],
        stopped=[bool(p.stopped) for p in s.points], load_kind=s.kind,
        behind=[bool(p.behind and p.behind.startswith("fell behind")) for p in s.points],
        capacity=capacity_mark(rows.get(s.key), s, target)) for s in load]
    series_cells = [p.cell for s in load for p in s.points]
    note = _predicted_words([n for n in series_cells
                             if n in by_name and is_prediction(by_name[n].manifest)],
                            series_cells)
    if curves:
        figures.append(ReadyFigure(
            "throughput_latency.png",
            "Output tokens/s against TPOT and TTFT across load points, SLO lines drawn in"
            + (", the capacity at SLO marked" if any(c.capacity for c in curves) else ""),
            _drew(functools.partial(plots.throughput_latency, curves,
                                    out_dir / "throughput_latency.png", slo=ctx.slo,
                                    note=note))))
    return figures


def _drew(draw: Callable[[], object]) -> Callable[[], bool]:
    """``draw`` (a plot function, which returns its path or None), answering whether it drew."""
    return lambda: bool(draw())


def warm_up(tmp_dir: Path, *, stop: Callable[[], bool] = lambda: False) -> None:
    """Read a parquet file and draw the run figures once, on made-up data, into ``tmp_dir``:
    fonts, tick and text layout, pyarrow's conversions and the PNG writer
    are then loaded before a real run folder is ready (``harness.sim.report_process``).
    ``stop()`` is asked before each figure: real work waiting makes the warm-up pointless."""
    rng = np.random.default_rng(0)
    latency = np.exp(rng.uniform(-7.0, 2.5, 64))  # about 1 ms to 12 s: several decades
    t_s = np.sort(latency)

    def latency_cdfs() -> None:
        path = tmp_dir / "warm_up.parquet"
        write_parquet_atomic(columns.table({"ttft_s": columns.floats(latency)}), path)
        cols = read_columns(path, ("ttft_s",)) or {}
        plots.latency_cdfs({"a": {m: cols.get("ttft_s", latency)
                                  for m, _ in plots.LATENCY_PANELS}},
                           tmp_dir / "latency_cdf.png")

    def throughput() -> None:
        path = tmp_dir / "warm_up_chunks.parquet"
        write_parquet_atomic(columns.table({"t_s": columns.floats(t_s),
                                            "num_tokens": columns.ints([1] * t_s.size)}), path)
        last = last_chunk_s(path)
        if last is None:
            return
        edges = plots.token_bin_edges(last)
        counts = chunk_tokens_binned(path, 0.0, edges)
        if counts is not None:
            plots.throughput_over_time({"a": plots.TokenRate(counts, last)}, edges,
                                       tmp_dir / "throughput.png")

    for draw in (latency_cdfs,
                 lambda: plots.engine_state({"a": plots.EngineState(t_s, t_s, t_s,
                                                                    t_s / t_s[-1])},
                                            tmp_dir / "engine_state.png"),
                 throughput):
        if stop():
            return
        draw()


def render_scenario_report(scenario_dir: Path, *, out_file: Path | None = None,
                           baseline: str | None = None, metrics_doc: str | None = None) -> Path:
    """``<scenario_dir>/report.md`` comparing every cell of a scenario sweep."""
    scenario_dir = Path(scenario_dir)
    meta, cells = load_scenario_dir(scenario_dir)
    names = [c.name for c in cells]
    if baseline is not None and baseline not in names:
        raise ValueError(f"--baseline {baseline!r}: no such cell; cells: {', '.join(names)}")
    ctx = scenario_context(meta, cells, scenario_dir, baseline=baseline, metrics_doc=metrics_doc)
    return write_report(cells, ctx, out_file or scenario_dir / REPORT_FILE)


def render_run_report(run_dir: Path, *, metrics_doc: str | None = None,
                      drawn: Mapping[str, bool] | None = None) -> Path:
    """``<run_dir>/report.md`` for one ``simulate`` or ``replay`` run folder (``drawn``: the
    figures ``draw_run_figure`` drew already)."""
    run_dir = Path(run_dir)
    cell = load_run(run_dir)
    ctx = ReportContext(
        title=f"Run {run_dir.name}",
        slo=slo_from([cell], {}),
        command=[str(a) for a in cell.manifest.get("command") or []] or None,
        rerender=["batchlab", "report", display_path(str(run_dir))],
        metrics_doc=metrics_doc,
    )
    return write_report([cell], ctx, run_dir / REPORT_FILE, drawn=drawn)


def mark_run_report_stale(run_dir: Path, why: str) -> bool:
    """Replace ``<run_dir>/report.md`` (atomically, as ``write_report`` writes it) by a note
    that it is out of date (``why``) and how to draw it again; False when there is none.

    For a command about to rewrite what the report was drawn from (``batchlab summarize``),
    before it does: interrupted before it draws the report again, it leaves a report that
    says so, never one that quotes figures the folder no longer holds. The file stays, so
    the command run again draws it again, as ``batchlab report DIR`` does."""
    run_dir = Path(run_dir)
    out_file = run_dir / REPORT_FILE
    if not out_file.exists():
        return False
    rerender = shlex.join(["batchlab", "report", display_path(str(run_dir))])
    _write_atomic(f"# Run {run_dir.name}\n\n"
                  f"This report is out of date: {why}. `{rerender}` draws it again from the "
                  "files beside it.\n", out_file)
    return True


def render_comparison(dirs: Sequence[Path], out_file: Path, *, baseline: str | None = None,
                      title: str | None = None, metrics_doc: str | None = None) -> Path:
    """Compare run folders made at any time (``batchlab report DIR DIR ...``)."""
    cells, metas = collect(dirs)
    if len(dirs) == 1 and metas:
        meta = metas[0]
        ctx = scenario_context(meta, cells, Path(dirs[0]), baseline=baseline,
                               metrics_doc=metrics_doc)
    else:
        names = [c.name for c in cells]
        if baseline is not None and baseline not in names:
            raise ValueError(f"--baseline {baseline!r}: no such cell; cells: {', '.join(names)}")
        question = " / ".join(str(m["question"]) for m in metas if m.get("question")) or None
        ctx = ReportContext(
            title=title or "Comparison of " + ", ".join(names),
            question=question, baseline=baseline, slo=slo_from(cells, {}),
            rerender=["batchlab", "report", *(display_path(str(d)) for d in dirs),
                      *(["--baseline", baseline] if baseline else []),
                      "-o", display_path(str(out_file))],
            metrics_doc=metrics_doc,
            notes=difference_notes(cells),
        )
    return write_report(cells, ctx, out_file)
