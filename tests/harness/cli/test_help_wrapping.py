"""Help texts wrap without breaking a word at its hyphen: a path or flag in an example
(``scenarios/batch-size.yaml``, ``--max-num-seqs``) must copy whole."""

from __future__ import annotations

import argparse
import re

import pytest

from harness.cli import build_parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def test_no_help_text_breaks_a_word_at_a_hyphen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "72")
    parser, _ = build_parser()
    broken = []
    for p in _parsers(parser):
        text = p.format_help()
        broken += [f"{p.prog}: {m.group(0)!r}" for m in re.finditer(r"\S*\w-\n\s*\S+", text)]
    assert not broken, broken
