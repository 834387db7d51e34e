"""bench/client_capacity.py's comparison with vLLM's client, without vLLM running: which
arrivals count, which ratios it prints, and that vLLM is asked for no request before the run."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_SERVE = "lib/python3.11/site-packages/vllm/benchmarks/serve.py"


@pytest.fixture
def cc(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("client_capacity")


def test_every_request_of_the_run_counts(cc: ModuleType) -> None:
    log = {f"r{i}": [1_000 * i, 1_000 * i + 5] for i in range(5)}
    assert cc.run_arrivals(log, 5) == [0, 1_000, 2_000, 3_000, 4_000]


def test_only_requests_before_the_run_beyond_its_count_are_dropped(cc: ModuleType) -> None:
    log = {"test": [10], **{f"r{i}": [1_000 * (i + 1)] for i in range(3)}, "empty": []}
    assert cc.run_arrivals(log, 3) == [1_000, 2_000, 3_000]


def test_ratios_are_of_errors_and_none_of_a_non_positive_one(cc: ModuleType) -> None:
    assert cc.ratio(0.002, 0.001) == "2.00x"
    assert cc.ratio(0.0, 0.001) == "0.00x"
    assert cc.ratio(0.001, 0.0) == "n/a"
    assert cc.ratio(-0.001, 0.001) == "n/a"
    assert cc.ratio(float("nan"), 0.001) == "n/a"


def test_vllm_is_asked_for_no_test_or_warm_up_request(cc: ModuleType,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    def popen(argv: list[str], **_kwargs: Any) -> None:
        started.append(argv)

    monkeypatch.setattr(subprocess, "Popen", popen)
    cc.VllmClient("http://127.0.0.1:1", Path("tok"))
    argv = started[0]
    assert argv[argv.index("--ready-check-timeout-sec") + 1] == "0"
    assert argv[argv.index("--num-warmups") + 1] == "0"


def test_the_installed_vllm_knows_the_flags() -> None:
    serve = REPO / ".venvs" / "vllm" / VLLM_SERVE
    if not serve.is_file():
        pytest.skip(f"no vLLM client here ({serve} does not exist)")
    text = serve.read_text()
    assert '"--ready-check-timeout-sec"' in text
    assert '"--num-warmups"' in text
