"""Profile files: a bad ``metadata`` is the file's error, named with its key path; keys starting
with ``_`` are notes that change nothing, not even the digest of what was measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.knobs import Knobs
from adapters.reference.config import ConfigError, ReferenceConfig
from adapters.reference.cost_model import (
    PROFILES_DIR,
    ProfileError,
    load_profile,
    profile_accuracy,
    profile_changed_since_measured,
    profile_digest,
    profile_scheduler_defaults,
)


def _shipped(name: str = "vllm-h100-sxm") -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((PROFILES_DIR / f"{name}.json").read_text())
    return raw


def _with_scheduler(tmp_path: Path, **scheduler: object) -> Path:
    raw = _shipped()
    raw["metadata"]["scheduler"].update(scheduler)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return path


def _from_knobs(path: Path) -> ReferenceConfig:
    return ReferenceConfig.from_knobs(Knobs(given=frozenset()), model="llama-3.1-8b", gpu=None,
                                      profile=str(path))


@pytest.mark.parametrize(("scheduler", "message"), [
    ({"max_num_seqs": -5}, "metadata.scheduler.max_num_seqs: must be a positive integer, got -5"),
    ({"block_size": "16"}, "metadata.scheduler.block_size: must be a positive integer, got '16'"),
    ({"policy": "lifo"}, "metadata.scheduler.policy: 'lifo' is not one of"),
    ({"chunked_prefill": "yes"}, "metadata.scheduler.chunked_prefill: must be true or false"),
    ({"gpu_memory_utilization": 2}, "metadata.scheduler.gpu_memory_utilization: must be in"),
])
def test_a_bad_engine_default_names_the_file_and_its_key_path(
        tmp_path: Path, scheduler: dict[str, object], message: str) -> None:
    path = _with_scheduler(tmp_path, **scheduler)
    with pytest.raises(ConfigError) as info:
        _from_knobs(path)
    assert str(info.value).startswith(f"profile: {path}: {message}")


def test_a_given_knob_does_not_hide_a_bad_default(tmp_path: Path) -> None:
    path = _with_scheduler(tmp_path, max_num_seqs=0)
    with pytest.raises(ConfigError, match=r"metadata\.scheduler\.max_num_seqs"):
        ReferenceConfig.from_knobs(Knobs(max_num_seqs=8, given=frozenset({"max_num_seqs"})),
                                   model="llama-3.1-8b", gpu=None, profile=str(path))


@pytest.mark.parametrize(("metadata", "key"), [
    ("oops", "metadata"),
    ([1, 2], "metadata"),
    ({"scheduler": "fast"}, "metadata.scheduler"),
])
def test_metadata_that_is_not_an_object_is_refused(tmp_path: Path, metadata: object,
                                                   key: str) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**_shipped(), "metadata": metadata}))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(info.value).startswith(f"{path}: {key}: must be a JSON object, got ")
    with pytest.raises(ProfileError, match=f"{key}: must be a JSON object"):
        profile_scheduler_defaults(path)
    with pytest.raises(ConfigError, match=rf"^profile: {path}: {key}: "):
        _from_knobs(path)


def test_underscore_keys_do_not_change_the_digest(tmp_path: Path) -> None:
    raw = _shipped()
    noted = {**raw, "_note": "hello", "_fitted_by": {"who": "me"}}
    assert profile_digest(noted) == profile_digest(raw)
    path = tmp_path / "noted.json"
    path.write_text(json.dumps(noted))
    assert not profile_changed_since_measured(path)
    assert profile_accuracy(path) == profile_accuracy("vllm-h100-sxm")
    # a coefficient is not a note
    assert profile_digest({**raw, "step_overhead_s": 1e-3}) != profile_digest(raw)
