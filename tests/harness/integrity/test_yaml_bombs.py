"""Scenario YAML: an alias bomb is refused before anything is expanded; anchors used as meant
still work; nested lists in ``extra_args`` fail at load with file:line:key."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.scenario import ScenarioError, _yaml, load_scenario

HEAD = """\
name: demo
question: Is the file safe to load?
trace:
  path: azure_conv_excerpt.csv
  limit: 3
model: llama-3.1-8b
gpu: h100-sxm
"""


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + textwrap.dedent(body))
    return path


def laughs(levels: int, width: int = 9) -> tuple[str, str]:
    """``a: &a [x, x, ...]``, ``b: &b [*a, *a, ...]``, ...: width**levels values in a few lines."""
    names = "abcdefghijklmnop"[:levels]
    lines = [f"  a: &a [{', '.join(['lol'] * width)}]"]
    for prev, name in itertools.pairwise(names):
        lines.append(f"  {name}: &{name} [{', '.join([f'*{prev}'] * width)}]")
    return "\n".join(lines), names[-1]


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the nodes the loader expands into plain values."""
    calls: list[int] = []
    real = _yaml._convert

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_yaml, "_convert", counting)
    return calls


def test_billion_laughs_in_extra_args_is_refused_unexpanded(
    tmp_path: Path, conversions: list[int]
) -> None:
    anchors, last = laughs(10)  # 9**10 = 3.5 billion values
    path = write(tmp_path, f"""\
        engines:
          - name: v
            engine: vllm
            knobs: {{extra_args: *{last}}}
        """)
    path.write_text(path.read_text().replace(HEAD, HEAD + "x_anchors:\n" + anchors + "\n"))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert "aliases here expand to more than 100000 values" in info.value.message
    assert info.value.line is not None and 9 <= info.value.line <= 18  # one of the anchors
    assert conversions == []  # refused before a single node was expanded


def test_the_expanded_size_is_counted_without_expanding() -> None:
    import yaml

    anchors, _ = laughs(4)
    root = yaml.SafeLoader("x:\n" + anchors + "\n").get_single_node()
    assert root is not None
    # a: 1 + 9 = 10; b: 1 + 9*10 = 91; c: 1 + 9*91 = 820; d: 1 + 9*820 = 7381 values;
    # their mapping 1 + 4 keys + the four; the document 1 + its key + that mapping.
    assert _yaml.check_expanded_size(root, "f.yaml") == 1 + 1 + (1 + 4 + 10 + 91 + 820 + 7381)
    with pytest.raises(ScenarioError) as info:
        _yaml.check_expanded_size(root, "f.yaml", limit=7380)
    assert info.value.line == 5  # d's line: where the count passes the limit


def test_merge_key_bomb_is_refused(tmp_path: Path, conversions: list[int]) -> None:
    lines = ["  m0: &m0 {k0: 1, k1: 2}"]
    for i in range(1, 40):
        lines.append(f"  m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], n{i}: 1}}")
    path = write(tmp_path, """\
        engines:
          - {name: r, engine: reference}
        """)
    path.write_text(path.read_text().replace(HEAD, HEAD + "x:\n" + "\n".join(lines) + "\n"))
    with pytest.raises(ScenarioError, match="expand to more than"):
        load_scenario(path)
    assert conversions == []


def test_an_alias_to_its_own_parent_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + "loop: &loop [1, *loop]\nengines: [{name: r, engine: reference}]\n")
    with pytest.raises(ScenarioError, match="refers to a node that contains it"):
        load_scenario(path)


def test_anchors_and_merge_keys_used_as_meant_still_load(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        engines:
          - name: a
            engine: reference
            knobs: &base {max_num_seqs: 8, max_num_batched_tokens: 4096}
          - name: b
            engine: reference
            knobs:
              <<: *base
              max_num_seqs: 16
        """)
    scenario = load_scenario(path)
    knobs = {e.name: e.knobs for e in scenario.engines}
    assert knobs == {"a": {"max_num_seqs": 8, "max_num_batched_tokens": 4096},
                     "b": {"max_num_seqs": 16, "max_num_batched_tokens": 4096}}


def test_a_key_written_twice_is_still_a_duplicate(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        engines:
          - name: a
            engine: reference
            name: b
        """)
    with pytest.raises(ScenarioError, match="duplicate key") as info:
        load_scenario(path)
    assert info.value.line == 11


@pytest.mark.parametrize(("body", "line", "key", "kind"), [
    ("""\
     engines:
       - name: v
         engine: vllm
         knobs:
           extra_args: [--enforce-eager, [--max-loras, 2]]
     """, 12, "engines[0].knobs.extra_args[1]", "a list"),
    ("""\
     engines:
       - name: v
         engine: vllm
         knobs:
           extra_args:
             - --enforce-eager
             - {--max-loras: 2}
     """, 14, "engines[0].knobs.extra_args[1]", "a mapping"),
    ("""\
     engines:
       - {name: v, engine: vllm}
     grid:
       extra_args: [[--enforce-eager], [--max-loras, [2]]]
     """, 11, "grid.extra_args[1][1]", "a list"),
])
def test_nested_extra_args_fail_at_load_with_their_line(
    tmp_path: Path, body: str, line: int, key: str, kind: str
) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, body))
    err = info.value
    assert (err.line, err.key) == (line, key)
    assert err.message == f"every item must be one argv item (text), got {kind}"
    assert str(err).startswith(f"{tmp_path / 's.yaml'}:{line}: {key}: ")
