"""A profile is checked whole when it is loaded: a malformed ``metadata.fit`` record, an unknown
``metadata.scheduler`` key or a key written twice is the file's error, named with its key path,
before anything runs; not a traceback after the run (the accuracy quoted under its figures
reads the fit record), nor a default silently kept, nor the last of two values silently taken.
A calibrated profile's own fit record, of other keys altogether, is not refused."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.reference.cost_model import (
    PROFILES_DIR,
    ProfileError,
    load_profile,
    profile_accuracy,
    profile_changed_since_measured,
    profile_metadata,
    profile_scheduler_defaults,
    shipped_profiles,
)
from harness.calibrate import LINEAR_TERMS, StepFit
from harness.cli import main

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")


def _shipped(name: str = "vllm-h100-sxm") -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((PROFILES_DIR / f"{name}.json").read_text())
    return raw


def _write(tmp_path: Path, raw: dict[str, Any], name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw, indent=2))
    return path


def _with_fit(tmp_path: Path, **fit: object) -> Path:
    raw = _shipped()
    raw["metadata"]["fit"].update(fit)
    return _write(tmp_path, raw)


def _refused(path: Path, message: str) -> None:
    """Every reader of the profile refuses it with ``message`` after the file's name."""
    for read in (load_profile, profile_metadata, profile_scheduler_defaults, profile_accuracy,
                 profile_changed_since_measured):
        with pytest.raises(ProfileError) as info:
            read(path)
        assert str(info.value).startswith(f"{path}: {message}"), read.__name__


# -- metadata.fit -------------------------------------------------------------------------------

@pytest.mark.parametrize(("fit", "message"), [
    ({"train": "x"}, 'metadata.fit.train: expected an object, got a string ("x")'),
    ({"held_out": 3}, "metadata.fit.held_out: expected an object, got a number (3)"),
    ({"held_out_by_kind": []}, "metadata.fit.held_out_by_kind: expected an object, got an array"),
    ({"held_out_workload_published": True},
     "metadata.fit.held_out_workload_published: expected an object, got true"),
    ({"held_out_by_kind": {"throughput": 0.2}},
     "metadata.fit.held_out_by_kind.throughput: expected an object, got a number (0.2)"),
    ({"held_out": {"num_rows": 8, "median_abs_error": "23%"}},
     'metadata.fit.held_out.median_abs_error: expected a number, got a string ("23%")'),
    ({"train": {"num_rows": 2.5}}, "metadata.fit.train.num_rows: expected an integer, got a "
                                   "number (2.5)"),
    ({"train": {"num_rows": True}}, "metadata.fit.train.num_rows: expected an integer, got true"),
    ({"held_out": {"worst_abs_error": math.nan}},
     "metadata.fit.held_out.worst_abs_error: must be a finite number >= 0, got nan"),
    ({"held_out": {"median_abs_error": -0.1}},
     "metadata.fit.held_out.median_abs_error: must be a finite number >= 0, got -0.1"),
    ({"held_out": {"sources": "vllm-blog"}},
     'metadata.fit.held_out.sources: expected an array, got a string ("vllm-blog")'),
    ({"measured_digest": 12}, "metadata.fit.measured_digest: expected a string, got a number"),
    ({"coefficients_from": ["vllm-h100-sxm"]},
     "metadata.fit.coefficients_from: expected a string, got an array"),
])
def test_a_malformed_fit_record_is_refused_at_load(tmp_path: Path, fit: dict[str, object],
                                                   message: str) -> None:
    _refused(_with_fit(tmp_path, **fit), message)


@pytest.mark.parametrize("fit", ["fitted", 3, [1, 2], True])
def test_a_fit_record_that_is_not_an_object_is_refused(tmp_path: Path, fit: object) -> None:
    raw = _shipped()
    raw["metadata"]["fit"] = fit
    _refused(_write(tmp_path, raw), "metadata.fit: expected an object, got ")


def _calibrated_fit() -> dict[str, Any]:
    """The fit record ``batchlab calibrate`` writes (harness/calibrate/profile.py)."""
    fit = StepFit(memory_bytes_per_s=math.inf, compute_flops_per_s=2e11,
                  coefficients=dict.fromkeys(LINEAR_TERMS, 1e-4), num_samples=120,
                  num_outliers=2, median_abs_relative_error=0.03, p90_abs_relative_error=0.08,
                  by_phase={"decode": 0.02})
    return fit.as_dict()


@pytest.mark.parametrize("metadata", [
    {"fit": _calibrated_fit()},  # calibrate's own record: other keys altogether
    {},  # no fit record
    {"fit": None},
    {"fit": {}},
    {"fit": {"train": None, "held_out": None, "held_out_workload_published": None,
             "held_out_by_kind": {}, "method": "by hand", "coefficients": ["x"]}},
])
def test_other_fit_records_still_load(tmp_path: Path, metadata: dict[str, Any]) -> None:
    raw = {"step_overhead_s": 1e-3, "source": "mine", "metadata": metadata}
    path = _write(tmp_path, raw, "mine.json")
    assert load_profile(path).step_overhead_s == 1e-3
    assert profile_accuracy(path) is None
    assert not profile_changed_since_measured(path)


def test_every_shipped_profile_still_loads() -> None:
    assert shipped_profiles()
    for name in shipped_profiles():
        load_profile(name)
        assert profile_scheduler_defaults(name)
        assert profile_accuracy(name) is not None, name


# -- metadata.scheduler ---------------------------------------------------------------------------

def test_an_unknown_scheduler_key_is_refused_with_the_close_match(tmp_path: Path) -> None:
    raw = _shipped()
    raw["metadata"]["scheduler"]["max_num_seq"] = 2
    path = _write(tmp_path, raw)
    _refused(path, "metadata.scheduler: unknown key 'max_num_seq' (did you mean "
                   "'max_num_seqs'?); known keys: max_num_seqs, max_num_batched_tokens, ")


def test_an_unknown_scheduler_key_without_a_close_match_lists_the_known(tmp_path: Path) -> None:
    raw = _shipped()
    raw["metadata"]["scheduler"]["turbo"] = True
    with pytest.raises(ProfileError) as info:
        load_profile(_write(tmp_path, raw))
    assert "unknown key 'turbo'; known keys: " in str(info.value)
    assert "did you mean" not in str(info.value)


def test_scheduler_sources_and_notes_are_not_defaults(tmp_path: Path) -> None:
    raw = _shipped()
    raw["metadata"]["scheduler"]["_note"] = "set by hand"
    path = _write(tmp_path, raw)
    defaults = profile_scheduler_defaults(path)
    assert "sources" in raw["metadata"]["scheduler"]
    assert "sources" not in defaults and "_note" not in defaults
    assert defaults == profile_scheduler_defaults("vllm-h100-sxm")
    assert not profile_changed_since_measured(path)  # a note changes nothing measured


# -- keys written twice ---------------------------------------------------------------------------

def _with_text(tmp_path: Path, old: str, new: str) -> Path:
    text = (PROFILES_DIR / "vllm-h100-sxm.json").read_text()
    assert text.count(old) == 1
    path = tmp_path / "bad.json"
    path.write_text(text.replace(old, new))
    return path


def test_a_key_written_twice_is_refused(tmp_path: Path) -> None:
    path = _with_text(tmp_path, '"memory_efficiency": ',
                      '"memory_efficiency": 0.5,\n  "memory_efficiency": ')
    _refused(path, "memory_efficiency: appears 2 times in one JSON object (values 0.5, ")


def test_a_nested_key_written_twice_is_named_by_its_path(tmp_path: Path) -> None:
    path = _with_text(tmp_path, '"max_num_seqs": 1024,',
                      '"max_num_seqs": 2, "max_num_seqs": 1024,')
    _refused(path, "metadata.scheduler.max_num_seqs: appears 2 times in one JSON object "
                   "(values 2, 1024): remove all but one")


def test_a_key_written_twice_inside_a_list_is_named_by_its_index(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"metadata": {"notes": [{"a": 1}, {"b": 1, "b": 2, "b": 3, "b": 4}]}}')
    _refused(path, "metadata.notes[1].b: appears 4 times in one JSON object "
                   "(values 1, 2, 3, ...)")


# -- end to end: exit 2, one line, nothing run, nothing written ---------------------------------

def _unknown_scheduler_key(tmp_path: Path) -> Path:
    raw = _shipped()
    raw["metadata"]["scheduler"]["max_num_seq"] = 2
    return _write(tmp_path, raw)


# Each bad profile of the two defects, and the field its message must name.
BAD_PROFILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fit.train": (lambda tmp: _with_fit(tmp, train="x"), "metadata.fit.train"),
    "fit.held_out": (lambda tmp: _with_fit(tmp, held_out=3), "metadata.fit.held_out"),
    "fit.held_out_by_kind": (lambda tmp: _with_fit(tmp, held_out_by_kind=[]),
                             "metadata.fit.held_out_by_kind"),
    "scheduler": (_unknown_scheduler_key, "metadata.scheduler: unknown key 'max_num_seq'"),
    "duplicate": (lambda tmp: _with_text(tmp, '"memory_efficiency": ',
                                         '"memory_efficiency": 0.5,\n  "memory_efficiency": '),
                  "memory_efficiency: appears 2 times"),
}


@pytest.mark.parametrize("case", list(BAD_PROFILES))
def test_each_command_refuses_a_bad_profile_before_it_runs(
        tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    make, field = BAD_PROFILES[case]
    path = make(tmp_path)
    started: list[object] = []
    # were the profile let through, the server would not block the test: it records its start
    monkeypatch.setattr("harness.serve.serve", lambda *a, **k: started.append(a))
    out = tmp_path / "run"
    for argv in (["simulate", "--profile", str(path), "--trace", TRACE, "--limit", "5",
                  "--out", str(out)],
                 ["costmodel", "--profile", str(path)],
                 ["serve", "reference", "--profile", str(path), "--port", "0"]):
        assert main(argv) == 2, argv[0]
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, (argv[0], captured.err)
        assert str(path) in lines[0] and field in lines[0], argv[0]
        assert "Traceback" not in captured.err
    assert not started
    assert not out.exists()
