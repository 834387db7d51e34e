"""Environment variables a knob maps to (TGI's PREFILL_CHUNKING, PREFIX_CACHING,
TGI_WIGGLE_ROOM) given again with --engine-env: never silently overriding the knob. A knob given
with another value is refused; a knob left unset is recorded as overridden."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import tgi
from adapters.base import KnobError, Knobs, LaunchPlan, MappedKnob
from harness.cli import main

REPO = Path(__file__).resolve().parents[2]


def plan(knobs: dict[str, object], env: dict[str, str]) -> LaunchPlan:
    adapter = tgi.TgiAdapter("m", port=3000, runtime="native", env=env)
    return adapter.plan(Knobs.from_mapping(knobs))


def by_knob(p: LaunchPlan) -> dict[str, MappedKnob]:
    return {m.knob: m for m in p.mapping}


def test_an_engine_env_variable_against_a_given_knob_is_refused() -> None:
    """Issue case: --no-chunked-prefill --no-prefix-caching with --engine-env
    PREFILL_CHUNKING=1 --engine-env PREFIX_CACHING=1 ran with both on while the mapping said
    PREFILL_CHUNKING=0 and PREFIX_CACHING=0 were applied."""
    with pytest.raises(KnobError) as err:
        plan({"chunked_prefill": False, "prefix_caching": False},
             {"PREFILL_CHUNKING": "1", "PREFIX_CACHING": "1"})
    assert str(err.value) == (
        "tgi: a knob and --engine-env ask for different settings: chunked_prefill=False sets "
        "PREFILL_CHUNKING=0, but --engine-env sets PREFILL_CHUNKING=1; prefix_caching=False "
        "sets PREFIX_CACHING=0, but --engine-env sets PREFIX_CACHING=1. Drop one of them (a "
        "knob left unset lets --engine-env decide, and is recorded as overridden).")


def test_an_engine_env_variable_for_an_unset_knob_is_recorded_as_overriding_it() -> None:
    p = plan({}, {"PREFILL_CHUNKING": "0", "PREFIX_CACHING": "1"})
    mapped = by_knob(p)
    for knob, var in (("chunked_prefill", "PREFILL_CHUNKING=0"),
                      ("prefix_caching", "PREFIX_CACHING=1")):
        m = mapped[knob]
        assert (m.value, m.status, m.flags) == (None, "not_applied", ())
        assert m.note == f"overridden by --engine-env {var}"
    assert p.env["PREFILL_CHUNKING"] == "0" and p.env["PREFIX_CACHING"] == "1"


def test_the_same_setting_twice_is_applied() -> None:
    p = plan({"chunked_prefill": False, "gpu_memory_utilization": 0.45},
             {"PREFILL_CHUNKING": "0", "TGI_WIGGLE_ROOM": "0.90"})
    mapped = by_knob(p)
    assert mapped["chunked_prefill"].status == "applied"
    assert mapped["gpu_memory_utilization"].flags == ("--cuda-memory-fraction 0.5",
                                                      "TGI_WIGGLE_ROOM=0.9")


def test_another_wiggle_room_than_the_memory_conversion_assumes_is_refused() -> None:
    with pytest.raises(KnobError) as err:
        plan({"gpu_memory_utilization": 0.8}, {"TGI_WIGGLE_ROOM": "0.8"})
    assert ("gpu_memory_utilization=0.8 sets TGI_WIGGLE_ROOM=0.9, but --engine-env sets "
            "TGI_WIGGLE_ROOM=0.8") in str(err.value)
    m = by_knob(plan({}, {"TGI_WIGGLE_ROOM": "0.8"}))["gpu_memory_utilization"]
    assert m.status == "not_applied" and m.note == "overridden by --engine-env TGI_WIGGLE_ROOM=0.8"


def tgi_dry_run(tmp_path: Path, *flags: str) -> int:
    """``replay --engine tgi --launch --dry-run`` (native) of four requests with ``flags``."""
    model = tmp_path / "m"
    model.mkdir()
    return main([
        "replay", "--launch", "--engine", "tgi", "--container-runtime", "native",
        "--model-path", str(model), "--model", "tiny", "--max-model-len", "2048",
        "--trace", str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"), "--limit", "4",
        *flags, "--dry-run", "--out", str(tmp_path / "o"),
    ])


def test_the_command_line_refuses_it_before_anything_starts(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = tgi_dry_run(tmp_path, "--no-chunked-prefill", "--no-prefix-caching", "--engine-env",
                       "PREFILL_CHUNKING=1", "--engine-env", "PREFIX_CACHING=1")
    err = capsys.readouterr().err
    assert code == 2
    assert ("chunked_prefill=False sets PREFILL_CHUNKING=0, but --engine-env sets "
            "PREFILL_CHUNKING=1") in err


def test_what_overrode_a_knob_is_recorded_apart_from_the_note() -> None:
    """``overridden_by`` says it as data (``harness.live.run.planned_policy`` reads it); the
    note says it in words, as before."""
    mapped = by_knob(plan({}, {"PREFILL_CHUNKING": "0"}))
    assert mapped["chunked_prefill"].overridden_by == ("--engine-env",)
    assert mapped["prefix_caching"].overridden_by == ()
    extra = by_knob(plan({"extra_args": ["--max-batch-size", "8"]}, {}))["max_num_seqs"]
    assert extra.overridden_by == ("extra_args",)
    assert extra.note == "overridden by extra_args (--max-batch-size)"
    both = by_knob(plan({"extra_args": ["--cuda-memory-fraction", "0.5"]},
                        {"TGI_WIGGLE_ROOM": "0.8"}))["gpu_memory_utilization"]
    assert both.overridden_by == ("extra_args", "--engine-env")
    assert both.note == ("overridden by extra_args (--cuda-memory-fraction); overridden by "
                         "--engine-env TGI_WIGGLE_ROOM=0.8")


def test_true_and_1_are_the_same_setting_as_tgi_reads_them() -> None:
    """TGI reads its boolean variables as ``value.lower() in {"1", "true"}``
    (server/text_generation_server/models/globals.py): --prefix-caching with --engine-env
    PREFIX_CACHING=true asks for one setting, not two."""
    p = plan({"prefix_caching": True, "chunked_prefill": False},
             {"PREFIX_CACHING": "true", "PREFILL_CHUNKING": "FALSE"})
    mapped = by_knob(p)
    assert mapped["prefix_caching"].status == "applied"
    assert mapped["chunked_prefill"].status == "applied"
    assert p.env["PREFIX_CACHING"] == "true" and p.env["PREFILL_CHUNKING"] == "FALSE"
    with pytest.raises(KnobError) as err:  # TGI reads "yes" as false
        plan({"prefix_caching": True}, {"PREFIX_CACHING": "yes"})
    assert ("prefix_caching=True sets PREFIX_CACHING=1, but --engine-env sets "
            "PREFIX_CACHING=yes") in str(err.value)
    with pytest.raises(KnobError) as err:
        plan({"prefix_caching": False}, {"PREFIX_CACHING": "True"})
    assert ("prefix_caching=False sets PREFIX_CACHING=0, but --engine-env sets "
            "PREFIX_CACHING=True") in str(err.value)


def test_the_command_line_takes_true_for_1(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = tgi_dry_run(tmp_path, "--prefix-caching", "--engine-env", "PREFIX_CACHING=true")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "ask for different settings" not in err
    assert "PREFIX_CACHING=true" in out
