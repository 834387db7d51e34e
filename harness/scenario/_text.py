"""Small text helpers for scenarios: values in names, suggestions, repository-relative paths."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adapters.knobs import SPECS

REPO_ROOT = Path(__file__).resolve().parents[2]


_FLAG = re.compile(r"(?<![\w-])--([a-z0-9]+(?:-[a-z0-9]+)*)")
# A knob's further flags (``--tp``), which are also the reference engine's own names for them
# (its config's ``tp``, as its errors begin): the key a scenario sets it with.
_KEY_OF = {alias.removeprefix("--").replace("-", "_"): spec.name
           for spec in SPECS.values() for alias in spec.aliases}


def as_keys(message: str) -> str:
    """A message written for the command line, in a scenario file's words: each ``--flag``
    becomes the key that sets the same thing (``--max-num-batched-tokens`` ->
    ``max_num_batched_tokens``, ``--tp`` -> ``tensor_parallel_size``)."""
    def key(m: re.Match[str]) -> str:
        name = m.group(1).replace("-", "_")
        return _KEY_OF.get(name, name)
    return _FLAG.sub(key, message)


def key_of(name: str) -> str:
    """The scenario key of a setting an engine's error names: ``tp`` -> ``tensor_parallel_size``."""
    return _KEY_OF.get(name, name)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'max_num_seqs'?"`` or ``""`` when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def value_text(value: Any) -> str:
    """A knob or load value as it appears in a cell name: ``8``, ``0.5``, ``true``, ``a+b``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return "+".join(value_text(v) for v in value)
    return str(value)


def safe_name(text: str) -> str:
    """``text`` with every run of characters a folder name should not hold replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "_"


def display_path(path: Path) -> str:
    """A path relative to the repository when it is inside it (stable across clones)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def exception_reason(exc: BaseException) -> str:
    """``"RuntimeError: first line of the message"``: why a cell failed, in one line."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
