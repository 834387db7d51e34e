"""YAML nodes that keep their line, and typed checks raising ScenarioError at file:line:key."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from harness.scenario._text import did_you_mean
from harness.scenario.schema import ScenarioError


@dataclass(frozen=True, slots=True)
class Node:
    """A YAML value and the (1-based) line it starts on; a map holds ``{key: (key Node, Node)}``."""

    value: Any
    line: int
    kind: Literal["map", "seq", "scalar"]


# A scenario file is a few hundred values. Aliases (``*name``) repeat a node without
# copying it, so a few lines can stand for billions of values (the "billion laughs"); a
# document that would expand past this many is refused before anything is expanded.
MAX_EXPANDED_NODES = 100_000


def compose(text: str, file: str) -> Node | None:
    """Parse YAML keeping line numbers (``yaml.compose`` nodes carry marks); ``None`` when empty."""
    try:  # the reader refuses control characters (a NUL) as soon as it is made
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise ScenarioError(file, text.count("\n", 0, exc.position) + 1, "",
                            f"invalid YAML: {exc.reason} "
                            f"(character #x{exc.character:04x})") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expanded_size(node, file)
        return _convert(loader, node, file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ScenarioError(file, line, "", f"invalid YAML: {problem}{_started(exc, line)}"
                            ) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(file, None, "", f"invalid YAML: {exc}") from None
    except RecursionError:
        raise ScenarioError(file, None, "", "invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def _started(exc: yaml.MarkedYAMLError, line: int | None) -> str:
    """Where the construct that the error broke began, when on another line than the error:
    an unclosed ``[`` is noticed only at the next line's ``:``. PyYAML's context says what it
    was reading ("while parsing a flow sequence"), its context mark where that began."""
    if not (exc.problem and exc.context and exc.context_mark is not None):
        return ""  # the context is the message already, or there is none
    started = exc.context_mark.line + 1
    if started == line:
        return ""
    what = re.fullmatch(r"while (?:parsing|scanning) an? (.+)", exc.context)
    if what is None:
        return f" ({exc.context}, from line {started})"
    return f" (in the {what.group(1)} that starts on line {started})"


def check_expanded_size(root: yaml.Node, file: str, limit: int = MAX_EXPANDED_NODES) -> int:
    """The number of values ``root`` stands for once its aliases and merge keys are expanded,
    counted without expanding them (each distinct node is visited once); a ScenarioError at
    the node where the count passes ``limit``, or at an alias to a node that contains it."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes being counted: an alias to one of them is a cycle

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        line = node.start_mark.line + 1
        if key in open_:
            raise ScenarioError(file, line, "", "a YAML alias refers to a node that contains it")
        open_.add(key)
        n = 1
        if isinstance(node, yaml.MappingNode):
            n += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n += sum(size(v) for v in node.value)
        open_.discard(key)
        if n > limit:
            raise ScenarioError(file, line, "", f"the YAML aliases here expand to more than "
                                f"{limit} values; write the values out instead of *aliases")
        sizes[key] = n
        return n

    return size(root)


def _convert(loader: yaml.SafeLoader, node: yaml.Node, file: str,
             own_keys: dict[int, set[int]] | None = None, where: str = "") -> Node:
    """``node`` as ``Node``s. ``own_keys``: for each mapping seen, its key nodes as written
    (before merge keys were flattened into it; an alias may bring the mapping back).
    ``where``: the node's key path (``engines[0].knobs``), which errors name."""
    own_keys = {} if own_keys is None else own_keys
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        own = own_keys.setdefault(id(node), {id(k) for k, _ in node.value})
        loader.flatten_mapping(node)  # YAML merge keys (<<): merged pairs first, then own
        out: dict[str, tuple[Node, Node]] = {}
        written: dict[str, int] = {}  # key -> line, for keys written in this mapping itself
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            key_line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise ScenarioError(file, key_line, _join(where, str(key)),
                                    "keys must be names (text)")
            # A merged key may be overridden (by a later merge or by the mapping's own key),
            # as YAML's merge keys allow; a key written twice in the mapping itself may not.
            if id(key_node) in own:
                if key in written:
                    raise ScenarioError(file, key_line, _join(where, key),
                                        f"duplicate key (first on line {written[key]})")
                written[key] = key_line
            out[key] = (Node(key, key_line, "scalar"),
                        _convert(loader, value_node, file, own_keys, _join(where, key)))
        return Node(out, line, "map")
    if isinstance(node, yaml.SequenceNode):
        return Node([_convert(loader, n, file, own_keys, _join(where, i))
                     for i, n in enumerate(node.value)], line, "seq")
    return Node(loader.construct_object(node), line, "scalar")


def key_lines(y: Node, where: str = "") -> dict[str, int]:
    """The line of every key under ``y``, by key path (``engines[0].knobs.max_model_len``;
    a list item's path, the line its item starts on): for errors raised after loading, when
    only the ``Scenario`` is at hand."""
    out: dict[str, int] = {}
    if y.kind == "map":
        for name, (key_y, value) in y.value.items():
            path = _join(where, name)
            out[path] = key_y.line
            out.update(key_lines(value, path))
    elif y.kind == "seq":
        for i, item in enumerate(y.value):
            path = _join(where, i)
            out[path] = item.line
            out.update(key_lines(item, path))
    return out


def plain(y: Node) -> Any:
    """The plain Python value (dicts, lists, scalars) without line numbers."""
    if y.kind == "map":
        return {k: plain(v) for k, (_, v) in y.value.items()}
    if y.kind == "seq":
        return [plain(v) for v in y.value]
    return y.value


class Checker:
    """Type checks that raise ScenarioError naming the file, the line and the key path."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, y: Node | None, key: str, message: str) -> ScenarioError:
        return ScenarioError(self.file, y.line if y is not None else None, key, message)

    def mapping(
        self, y: Node, key: str, known: Sequence[str], required: Sequence[str] = ()
    ) -> dict[str, Node]:
        if y.kind != "map":
            raise self.fail(y, key or "scenario", f"must be a mapping of keys, got {_kind(y)}")
        items: dict[str, tuple[Node, Node]] = y.value
        for name, (key_y, _) in items.items():
            if name not in known:
                raise self.fail(
                    key_y, _join(key, name),
                    f"unknown key{did_you_mean(name, known)} (known keys: {', '.join(known)})",
                )
        for name in required:
            if name not in items:
                raise self.fail(y, _join(key, name), "is required")
        return {name: value for name, (_, value) in items.items()}

    def seq(self, y: Node, key: str, *, nonempty: bool = True) -> list[Node]:
        if y.kind != "seq":
            raise self.fail(y, key, f"must be a list, got {_kind(y)}")
        if nonempty and not y.value:
            raise self.fail(y, key, "must not be empty")
        return list(y.value)

    def string(self, y: Node, key: str) -> str:
        if y.kind == "scalar" and isinstance(y.value, str):
            if not y.value.strip():
                raise self.fail(y, key, "must be non-empty text")
            return y.value
        # YAML reads 2024-01-01, yes, 1.10 as a date, a boolean, a number: quoted, they are text
        quote = ": quote it" if y.kind == "scalar" and y.value is not None else ""
        raise self.fail(y, key, f"must be text, got {_kind(y)}{quote}")

    def integer(self, y: Node, key: str, *, minimum: int | None = None) -> int:
        v = y.value
        if y.kind != "scalar" or not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(y, key, f"must be an integer, got {_kind(y)}")
        if minimum is not None and v < minimum:
            raise self.fail(y, key, f"must be at least {minimum}, got {v}")
        return v

    def number(self, y: Node, key: str, *, positive: bool = False) -> float:
        v = y.value
        if y.kind != "scalar" or not isinstance(v, (int, float)) or isinstance(v, bool):
            raise self.fail(y, key, f"must be a number, got {_kind(y)}" + _exponent_hint(v))
        if not math.isfinite(v) or (positive and v <= 0):
            raise self.fail(y, key, f"must be a {'positive ' if positive else ''}number, got {v}")
        return float(v)

    def bounded(self, y: Node, key: str, check: Callable[[Any, str], object], value: Any
                ) -> None:
        """Apply a check shared with the command line and trace files (``harness.traces.
        bounds``, ``adapters.knobs.check_positive_int``); its ValueError, at ``y``'s line."""
        try:
            check(value, key)
        except ValueError as exc:
            raise self.fail(y, key, str(exc).removeprefix(f"{key}: ")) from None

    def boolean(self, y: Node, key: str) -> bool:
        if y.kind != "scalar" or not isinstance(y.value, bool):
            raise self.fail(y, key, f"must be true or false, got {_kind(y)}")
        return y.value

    def choice(self, y: Node, key: str, choices: Sequence[str]) -> str:
        v = self.string(y, key)
        if v not in choices:
            raise self.fail(
                y, key, f"{v!r} is not one of {', '.join(choices)}{did_you_mean(v, choices)}"
            )
        return v


def _exponent_hint(value: object) -> str:
    """YAML 1.1 reads ``1e300`` as text (an exponent needs a dot and a sign: ``1.0e+300``)."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    return (f": YAML reads {value!r} as text; write it as {number:.1e}"
            if "e" in value.lower() else "")


def _kind(y: Node) -> str:
    if y.kind == "map":
        return "a mapping"
    if y.kind == "seq":
        return "a list"
    v = y.value
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if isinstance(v, (int, float)):
        return f"a number ({v})"
    if isinstance(v, datetime.datetime):
        return f"a date and time ({v.isoformat(sep=' ')})"
    if isinstance(v, datetime.date):
        return f"a date ({v.isoformat()})"
    if isinstance(v, str):
        return f"text ({v!r})"
    return f"{type(v).__name__} ({v!r})"  # YAML's binary, say


def _join(prefix: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{prefix}[{name}]"
    return f"{prefix}.{name}" if prefix else name
