"""A server batchlab attached to (``url:``, ``--url``) and did not start: what it reports about
itself, and whether it still answers.

No knob reaches such a server, so its configuration is whatever whoever started it chose, and
it may be restarted with another one between two runs. A run attached to it records what it
reported in its manifest (``engine.version_probe``: its ``/version``, ``/info`` or ``/props``
answer); ``reported_identity`` reads from that answer what the results depend on (the engine
version, the knobs it reports, the model it serves and, for a served reference engine, its whole
configuration), so that a resumed sweep or capacity search can tell whether the same server
still runs the same way (``changed_since``: what differs from what it reports now).

A server that stops answering mid-run (killed, out of memory, restarted) is told apart from one
that is merely slow: ``not_answering`` asks its health route, as ``batchlab validate`` does
after its live replay, and ``connection_failures`` counts the requests that could not connect or
whose stream was cut, which are no answer of the engine's about the load.

A server restarted under a run with another configuration answers again, but the run's figures
are then of two configurations, and its manifest records only the first: once the last request
has ended, ``changed_during_run`` asks the route that answered before the first request again
(``engine.version_probe_at_end``) and says what differs, and ``fail_if_restarted`` fails such
a run as ``fail_if_gone`` fails one whose server went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.manifest import jsonable, read_manifest, record_failed, update_manifest
from harness.redact import redact_tree, redact_url
from harness.target import TargetSpec

# Failed requests that the engine never answered: no connection, or a stream closed under them
CONNECTION_FAILURES = ("connect_error", "stream_cut")
# What an attached server reported differently after a run than before it, in its summary
# and manifest (``fail_if_restarted``)
CHANGED_DURING_RUN = "server_changed_during_run"


class ServerStoppedAnswering(RuntimeError):
    """The live server stopped answering during a run (a capacity probe, a sweep's cell): the
    run failed, its files say so, and it says nothing about the load."""


class ServerRestarted(RuntimeError):
    """The attached server described itself differently after a run (a sweep's cell) than
    before it: restarted with another configuration under it. The run failed, its files say
    so, and its figures are of two configurations."""


def is_attached(spec: TargetSpec) -> bool:
    """A live target batchlab attaches to rather than starts."""
    return spec.mode == "attach" and spec.url is not None


def reported_identity(version_probe: Any) -> dict[str, Any] | None:
    """What a server reported about itself in its version probe (``adapters.process.
    probe_version``'s answer, as a manifest's ``engine.version_probe`` records it), one entry a
    name: ``engine version``, ``engine``, ``model``, each knob it reports and, for a served
    reference engine, every setting of the configuration it publishes. None when it answered
    nothing (it cannot be compared)."""
    if not isinstance(version_probe, Mapping):
        return None
    from adapters.catalog import served_reference_config, server_reported_knobs

    body = jsonable(redact_tree(version_probe.get("body")))  # as the manifest records it
    version = version_probe.get("version")
    if body is None and version is None:
        return None
    out: dict[str, Any] = {"engine version": version}
    if isinstance(body, Mapping) and isinstance(body.get("engine"), str):
        out["engine"] = body["engine"]
    model = _served_model(body)
    if model is not None:
        out["model"] = model
    out.update(server_reported_knobs(body))
    config = served_reference_config(body)
    if config is not None:
        renamed = {"tp": "tensor_parallel_size"}
        for key, value in config.items():
            out.setdefault(renamed.get(key, key), value)
        prediction = body.get("prediction") if isinstance(body, Mapping) else None
        if isinstance(prediction, Mapping):
            out.setdefault("profile", prediction.get("profile"))
    shown: dict[str, Any] = jsonable(out)
    return shown


def _served_model(body: Any) -> str | None:
    """The model a server says it serves: a served reference's, TGI's ``model_id``,
    llama.cpp's ``model_path``, the first of ``/v1/models``; None when it says none."""
    if not isinstance(body, Mapping):
        return None
    from adapters.catalog import served_reference_config

    config = served_reference_config(body) or {}
    for value in (config.get("model"), body.get("model_id"), body.get("model_path")):
        if isinstance(value, str) and value:
            return value
    data = body.get("data")
    if isinstance(data, list) and data and isinstance(data[0], Mapping):
        first = data[0].get("id")
        return first if isinstance(first, str) and first else None
    return None


def recorded_identity(run_dir: Path) -> dict[str, Any] | None:
    """What the server a run attached to reported about itself then (its manifest); None when
    the run recorded no answer."""
    engine = read_manifest(run_dir).get("engine")
    return reported_identity(engine.get("version_probe") if isinstance(engine, Mapping)
                             else None)


def identity_now(spec: TargetSpec) -> dict[str, Any] | None:
    """What the attached server of ``spec`` reports about itself now (the same probe a live run
    makes before its first request); None when it does not answer, or cannot be planned."""
    from adapters.knobs import KnobError
    from adapters.process import probe_version
    from harness.live.session import plan_for

    try:
        plan = plan_for(spec)
    except KnobError:
        return None
    return reported_identity(asyncio.run(probe_version(plan.base_url, plan.version_paths)))


def identity_changes(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None,
                     *, when: tuple[str, str] = ("then", "now")) -> list[str]:
    """What differs between two ``reported_identity`` answers of a server, in words
    (``max_num_seqs: 8 then, 16 now``; ``when`` names the two moments); nothing when either
    is not known. Only what both answers report is compared: a key one of them lacks (a
    setting a newer batchlab serves, ``cost_model_digest``) is not known to differ."""
    if before is None or now is None:
        return []
    changes = []
    for name in sorted(set(before) & set(now)):
        old, new = before[name], now[name]
        if _text(old) != _text(new):
            changes.append(f"{name}: {_shown(old)} {when[0]}, {_shown(new)} {when[1]}")
    return changes


def changed_since(run_dir: Path, now: Mapping[str, Any] | None) -> list[str]:
    """What the attached server of the run in ``run_dir`` reports now (``now``,
    ``identity_now``) that differs from what it reported when that run was made; nothing
    when the two cannot be compared (no answer then, or none now)."""
    return identity_changes(recorded_identity(run_dir), now)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else _text(value)


def not_answering(spec: TargetSpec, timeout_s: float = 5.0) -> str | None:
    """Why the live server of ``spec`` does not answer its health route now (``/health does
    not answer (ConnectError)``, ``/health answers HTTP 503``), or None when it does (as
    ``harness.validate.engine_answers`` asks it)."""
    from adapters.knobs import KnobError
    from harness.live.session import plan_for

    try:
        plan = plan_for(spec)
    except KnobError:
        return None
    return health_problem(plan.base_url, plan.health_path, timeout_s)


def health_problem(base_url: str, health_path: str = "/health", timeout_s: float = 5.0
                   ) -> str | None:
    """Why the server at ``base_url`` does not answer ``health_path`` now, or None when it
    answers (anything below HTTP 500: a server without that route still answers)."""
    import httpx

    try:
        response = httpx.get(base_url.rstrip("/") + health_path, timeout=timeout_s,
                             trust_env=False)
    except httpx.HTTPError as exc:
        return f"{health_path} does not answer ({type(exc).__name__})"
    if response.status_code >= 500:
        return f"{health_path} answers HTTP {response.status_code}"
    return None


def gone_mid_run(url: str, summary: Mapping[str, Any], health_path: str = "/health"
                 ) -> str | None:
    """Why an attached server's run is a failed run, in words, or None: requests of it failed,
    some completed before (none: the server was never up, which the run's own "none of the
    requests completed" says), and the server does not answer now. Whatever the failures'
    kind: a server killed outright leaves connections refused or cut, one shut down cleanly
    ends its streams with an error event, and one frozen leaves them to time out. A server
    that answers again (restarted) leaves the failures to be counted as usual, unless it
    describes itself differently now (``fail_if_restarted``)."""
    failures = {str(k): int(v) for k, v in (summary.get("failures") or {}).items()
                if isinstance(v, int | float) and v}
    if not failures or not summary.get("num_completed"):
        return None
    down = health_problem(url, health_path)
    if down is None:
        return None
    said = ", ".join(f"{kind} {n}" for kind, n in failures.items())
    return (f"the server at {redact_url(url)} stopped answering during the run: "
            f"{sum(failures.values())} requests failed ({said}), "
            f"{summary['num_completed']} of {summary.get('num_requests')} completed, and "
            f"{down}")


def fail_if_gone(out_dir: Path, summary: Mapping[str, Any], url: str) -> str | None:
    """``gone_mid_run``, and when the server went, the run in ``out_dir`` recorded as failed
    (``record_failed``); why, or None."""
    why = gone_mid_run(url, summary)
    if why is not None:
        record_failed(out_dir, summary, why)
    return why


def changed_during_run(out_dir: Path, url: str, summary: Mapping[str, Any]) -> list[str]:
    """What the attached server of the run in ``out_dir`` (at ``url``: the manifest keeps it
    without credentials) reports differently now, the run over, than before its first request
    (``engine.version_probe``), in words (``engine version: 0.6.0 at start, 0.7.0 at end``).

    The route that answered then is asked once more, and its answer is recorded in the
    manifest as ``engine.version_probe_at_end``. Nothing is asked, and nothing is said, when
    the server answered nothing then, or the run completed no request (it measured nothing
    of either configuration, as its own "none of the requests completed" says); nothing is
    said when it answers nothing now (gone: ``gone_mid_run``)."""
    from adapters.process import probe_version

    if not summary.get("num_completed"):
        return []
    engine = read_manifest(out_dir).get("engine")
    start = engine.get("version_probe") if isinstance(engine, Mapping) else None
    if not isinstance(engine, Mapping) or not isinstance(start, Mapping) \
            or not isinstance(start.get("path"), str):
        return []
    end = asyncio.run(probe_version(url, (start["path"],)))
    with contextlib.suppress(OSError):  # a full disk must not hide what the server says
        update_manifest(out_dir, {"engine": {**engine, "version_probe_at_end": end}})
    return identity_changes(reported_identity(start), reported_identity(end),
                            when=("at start", "at end"))


def fail_if_restarted(out_dir: Path, summary: Mapping[str, Any], url: str) -> str | None:
    """Why the run in ``out_dir`` failed because its attached server was restarted under it
    with another configuration (``changed_during_run``), in words, or None when it was not.
    Such a run is recorded as failed (``record_failed``), what changed in its summary and
    manifest (``server_changed_during_run``): its figures are of two configurations and its
    manifest names the first, so no report, comparison or resumed sweep may read it as a
    measurement of either."""
    changes = changed_during_run(out_dir, url, summary)
    if not changes:
        return None
    why = (f"the server at {redact_url(url)} restarted during the run with another "
           f"configuration ({'; '.join(changes)}): its figures are of two configurations")
    with contextlib.suppress(OSError):  # record_failed says the rest, if it can
        update_manifest(out_dir, {CHANGED_DURING_RUN: changes})
    record_failed(out_dir, {**summary, CHANGED_DURING_RUN: changes}, why)
    return why


def connection_failures(summary: Mapping[str, Any]) -> dict[str, int]:
    """The requests of a run the engine never answered, by kind (``CONNECTION_FAILURES``)."""
    failures = summary.get("failures") or {}
    if not isinstance(failures, Mapping):
        return {}
    out = {}
    for kind in CONNECTION_FAILURES:
        count = failures.get(kind)
        if isinstance(count, int | float) and count > 0:
            out[kind] = int(count)
    return out
