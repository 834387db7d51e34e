"""Fixtures of the capacity search tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import harness.capacity.run as capacity_run
from harness.capacity import ProbeOutcome, run_probe


@pytest.fixture
def ctrl_c_on_probe(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[object]]:
    """``ctrl_c_on_probe(n)``: the search's ``n``-th probe is interrupted as Ctrl-C would
    interrupt it (KeyboardInterrupt as it starts); the others run. Returns the calls made,
    each probe's arguments."""

    def arm(n: int) -> list[object]:
        calls: list[object] = []

        def probe(*args: object, **kw: object) -> ProbeOutcome:
            calls.append(args)
            if len(calls) == n:
                raise KeyboardInterrupt
            return run_probe(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(capacity_run, "run_probe", probe)
        return calls

    return arm
