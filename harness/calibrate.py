"""DRAFT"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from adapters.base import Knobs, LaunchPlan
from adapters.process import ServerProcess, terminate_on_signals
from harness.live import DEFAULT_READY_TIMEOUT_S, plan_for
from harness.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class Server:
    plan: LaunchPlan
    base_url: str
    model: str  # what requests carry


@contextlib.contextmanager
def serving(engine: str, knobs: Knobs, *, model: str, served_model_name: str | None,
            url: str | None, log_dir: Path, allow_approximate: bool = False,
            engine_env: Mapping[str, str] | None = None, executable: str | None = None,
            ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> Iterator[Server]:
    plan = plan_for(engine, Knobs() if url else knobs, launch=url is None, url=url,
                    allow_approximate=allow_approximate, model=model,
                    served_model_name=served_model_name, engine_env=engine_env,
                    executable=executable)
    if not plan.launch:
        yield Server(plan, plan.base_url, plan.model)
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(plan.resolved_argv(str(log_dir.resolve())), log_dir=log_dir,
                           name=f"{plan.engine}-server", env=plan.env, stop_argv=plan.stop_argv)
    with terminate_on_signals(), server:
        server.start()
        asyncio.run(server.wait_ready(plan.base_url + plan.health_path,
                                      timeout_s=ready_timeout_s))
        yield Server(plan, plan.base_url, plan.model)


def burst(name: str, n: int, prompt: int, output: int) -> tuple[TraceRequest, ...]:
    return tuple(TraceRequest(f"{name}-{i}", 0.0, prompt, output) for i in range(n))
