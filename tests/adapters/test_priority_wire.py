"""What each engine's server makes of a request's priority is its adapter's fact
(``PriorityWire`` on its ``ServerWire``); the replay looks it up by engine name
(``adapters.catalog.priority_wire``) and names no engine itself."""

from __future__ import annotations

import pytest

from adapters import catalog, llamacpp, tgi, trtllm, vllm
from adapters.base import UNIT_FLOAT_RULE, PriorityWire, unit_float_priority


def test_each_engine_states_its_scale_and_what_it_does_off_the_priority_policy() -> None:
    facts = {name: (catalog.priority_wire(name).scale, catalog.priority_wire(name).off_policy)
             for name in catalog.ENGINES}
    assert facts == {
        "vllm": ("vllm-int", "http-400"),
        "tgi": ("vllm-int", "unstated"),
        "trtllm": ("unit-float-higher-first", "ignored"),
        "llamacpp": ("vllm-int", "no-priority"),
        "openai": ("vllm-int", "unstated"),
        "reference": ("vllm-int", "http-400"),  # as vLLM: harness/serve/openai.py
    }


@pytest.mark.parametrize("engine", catalog.ENGINES)
def test_each_engine_says_where_its_facts_were_read_and_how_notes_name_it(engine: str) -> None:
    wire = catalog.priority_wire(engine)
    assert wire.source
    if wire.scale != "vllm-int" or wire.off_policy in ("ignored", "no-priority"):
        assert wire.server  # the manifest's priority note names the server


def test_the_catalog_reads_the_adapters_own_wires() -> None:
    assert catalog.priority_wire("vllm") is vllm.WIRE.priority is vllm.PRIORITY
    assert catalog.priority_wire("tgi") is tgi.WIRE.priority
    assert catalog.priority_wire("trtllm") is trtllm.WIRE.priority
    assert catalog.priority_wire("llamacpp") is llamacpp.WIRE.priority


def test_no_engine_named_is_vllms_convention_as_the_trace_has_it() -> None:
    assert catalog.priority_wire(None) == PriorityWire() == catalog.priority_wire("other")
    sent = PriorityWire().value(-3)
    assert sent == -3 and type(sent) is int and PriorityWire().rule == "p"


def test_the_unit_float_scale_converts_through_the_wire_record() -> None:
    wire = catalog.priority_wire("trtllm")
    assert wire.rule == UNIT_FLOAT_RULE == "0.5 - atan(p)/pi"
    assert [wire.value(p) for p in (-1, 0, 1)] == [0.75, 0.5, 0.25]
    assert wire.value(5) == unit_float_priority(5)
