"""The policy a launched server runs with, as its plan knows it (``planned_policy``): one that
extra_args or --engine-env override is not known, whichever overrode it."""

from __future__ import annotations

from dataclasses import replace

from adapters import vllm
from adapters.base import Knobs, LaunchPlan, MappedKnob
from harness.live.run import planned_policy


def launched(policy: MappedKnob) -> LaunchPlan:
    return LaunchPlan("engine", ("serve",), mapping=(policy,))


def test_a_policy_an_engine_env_variable_overrides_is_not_known() -> None:
    by_env = MappedKnob("policy", None, (), "not_applied",
                        "overridden by --engine-env SCHEDULER=lifo", ("--engine-env",))
    assert planned_policy(launched(by_env), Knobs()) is None
    # not overridden, only not honoured: every adapter falls back to its FCFS queue
    approximated = replace(by_env, value="static", status="approximated",
                           note="approximated as fcfs: no static batching", overridden_by=())
    assert planned_policy(launched(approximated), Knobs()) == "fcfs"


def test_a_policy_extra_args_override_is_not_known() -> None:
    knobs = Knobs.from_mapping({"extra_args": ["--scheduling-policy", "priority"]})
    plan = vllm.VllmAdapter(model="m", port=8000).plan(knobs)
    [policy] = [m for m in plan.mapping if m.knob == "policy"]
    assert policy.overridden_by == ("extra_args",)
    assert planned_policy(plan, knobs) is None
    assert planned_policy(vllm.VllmAdapter(model="m", port=8000).plan(Knobs()), Knobs()) == "fcfs"
