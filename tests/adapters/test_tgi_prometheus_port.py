"""TGI's router binds a Prometheus listener on --hostname:--prometheus-port, 9000 unless given,
and panics when it cannot (launcher/src/main.rs, router/src/server.rs @db931fcf): a native
launch passes a second free port, so two TGIs, or anything else on 9000, do not stop it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters import tgi
from adapters.base import Knobs

TGI_OK = Knobs(chunked_prefill=False, preemption="none")


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_native_launch_passes_another_free_port_for_prometheus() -> None:
    argv = tgi.TgiAdapter("m", port=3000, runtime="native").plan(TGI_OK).argv
    assert argv.count("--prometheus-port") == 1
    prometheus = int(flag_value(argv, "--prometheus-port"))
    assert 0 < prometheus < 65536 and prometheus != 3000
    assert flag_value(argv, "--hostname") == "127.0.0.1"


def test_the_prometheus_port_is_never_the_main_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port found free a moment ago is not bound yet: the OS may offer it again."""
    offered: Iterator[int] = iter((41000, 41000, 41000, 41001))
    monkeypatch.setattr(tgi, "free_port", lambda host="127.0.0.1": next(offered))
    plan = tgi.TgiAdapter("m", runtime="native").plan(TGI_OK)
    assert flag_value(plan.argv, "--port") == "41000"
    assert flag_value(plan.argv, "--prometheus-port") == "41001"


def test_a_container_keeps_the_default_inside_its_own_network() -> None:
    plan = tgi.TgiAdapter("m", port=3001, runtime="docker", image="img:1").plan(TGI_OK)
    assert "--prometheus-port" not in plan.argv
    assert flag_value(plan.argv, "-p") == "127.0.0.1:3001:80"  # the one port published


def test_the_prometheus_port_is_listed_among_the_flags_batchlab_sets() -> None:
    assert any("--prometheus-port" in fixed for fixed in tgi.FIXED)
