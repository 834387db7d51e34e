"""trtllm-serve's click options with two names (tensorrt_llm/commands/serve.py @00209af1):
``--tensor_parallel_size`` is ``--tp_size``. The YAML batchlab generates is applied last, so a
knob it carries must be found against either name in extra_args, or the YAML silently wins."""

from __future__ import annotations

import pytest
import yaml

from adapters import trtllm
from adapters.base import KnobError, Knobs, LaunchPlan

TP_SPELLINGS = ["--tp_size", "--tp-size", "--tensor_parallel_size", "--tensor-parallel-size"]


def plan(**given: object) -> LaunchPlan:
    return trtllm.TrtllmAdapter("nvidia/model-FP8", port=8001).plan(Knobs.from_mapping(given))


def trt_yaml(p: LaunchPlan) -> dict[str, object]:
    loaded = yaml.safe_load(p.config_files[trtllm.CONFIG_FILE])
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize("flag", TP_SPELLINGS)
def test_another_tensor_parallel_size_in_extra_args_is_refused(flag: str) -> None:
    with pytest.raises(KnobError) as err:
        plan(tensor_parallel_size=2, extra_args=[flag, "4"])
    assert ("tensor_parallel_size=2 sets tensor_parallel_size: 2, but extra_args set "
            f"{flag} 4") in str(err.value)


@pytest.mark.parametrize("flag", TP_SPELLINGS)
def test_the_same_tensor_parallel_size_in_extra_args_replaces_the_yaml_key(flag: str) -> None:
    p = plan(tensor_parallel_size=2, extra_args=[flag, "2"])
    assert "tensor_parallel_size" not in trt_yaml(p)  # one value reaches the engine
    assert p.argv[-2:] == (flag, "2")
    m = next(m for m in p.mapping if m.knob == "tensor_parallel_size")
    assert m.status == "not_applied" and m.note == f"overridden by extra_args ({flag})"


@pytest.mark.parametrize("flag", TP_SPELLINGS)
def test_an_unset_tensor_parallel_size_lets_extra_args_decide(flag: str) -> None:
    p = plan(extra_args=[f"{flag}=4"])
    assert "tensor_parallel_size" not in trt_yaml(p)
    m = next(m for m in p.mapping if m.knob == "tensor_parallel_size")
    assert m.status == "not_applied" and m.note.startswith("overridden by extra_args")
