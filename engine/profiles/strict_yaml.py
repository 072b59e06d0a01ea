"""Strict YAML for the files expertbench reads and writes (profiles): a composed node tree with line marks, never
an object built from a tag, every value checked by the caller with errors naming file:line; and the canonical
writer (no aliases, lists indented under their key, short lists and mappings on one line, long texts folded, the
characters YAML would fold on reading written as escapes).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

_STR, _INT, _FLOAT, _BOOL, _NULL = (f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null"))
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


# ---- writing --------------------------------------------------------------------------------------------


class FlowSeq(list):
    """A list written on one line."""


class FlowMap(dict):
    """A mapping written on one line."""


class Text(str):
    """A long text, written as a folded block (wrapped at the dumper's width, read back as one line)."""


def flow(value):
    return FlowMap(value) if isinstance(value, dict) else FlowSeq(value)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # a saved file never holds aliases (a load refuses fan-outs)
        return True

    def increase_indent(self, flow=False, indentless=False):  # lists indented under their key
        return super().increase_indent(flow, False)


# YAML reads NEL and the Unicode line and paragraph separators as line breaks, which a plain, single-quoted or folded
# scalar folds into a space on reading: a text holding one is written double-quoted, where they are escapes.
_YAML_BREAKS = frozenset("\x85\u2028\u2029")


def _represent_text(d, data: str):
    if not _YAML_BREAKS.isdisjoint(data):
        return d.represent_scalar("tag:yaml.org,2002:str", str(data), style='"')
    if isinstance(data, Text):
        return d.represent_scalar("tag:yaml.org,2002:str", str(data), style=">" if "\n" not in data else "|")
    return d.represent_str(data)


_Dumper.add_representer(Text, _represent_text)
_Dumper.add_representer(str, _represent_text)
_Dumper.add_representer(
    FlowSeq, lambda d, data: d.represent_sequence("tag:yaml.org,2002:seq", list(data), flow_style=True)
)
_Dumper.add_representer(
    FlowMap, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)
)


def dump(data) -> str:
    """The canonical YAML text of plain data (FlowSeq, FlowMap and Text where the layout is chosen)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


# ---- reading ------------------------------------------------------------------------------------------------


def compose(text: str, path: Path, error: type[Exception], max_nodes: int, kind: str, expected: str):
    """The node tree of a YAML text (kind: what the file should be, 'a profile'; expected: the same said for an empty
    file), or error(file:line: why) for text that is not YAML, nests too deeply, is empty, holds an alias inside
    the value it names or expands past max_nodes values."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise error(f"{path}:{line}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}:1: not valid YAML: {exc}") from None
    except RecursionError:
        raise error(f"{path}:1: not {kind}: nested too deeply") from None
    if root is None:
        raise error(f"{path}:1: the file is empty: expected {expected}")
    if (nodes := expanded_nodes(root, path, error, kind)) > max_nodes:
        raise error(f"{path}:1: not {kind}: its aliases expand it to {nodes} values (at most {max_nodes})")
    return root


def expanded_nodes(root, path: Path, error: type[Exception], kind: str) -> int:
    """Nodes of the tree as a reader walks it, every alias expanded (memoised on the shared nodes, so counting a
    fan-out costs what the file is, not what it expands to). An alias inside the value it names (`a: &x {b: *x}`)
    would expand forever: refused with the line of that value."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the values being walked: an alias reaching one of them is a cycle
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if not done and id(node) in open_nodes:
            line = node.start_mark.line + 1
            raise error(f"{path}:{line}: not {kind}: an alias refers to the value that contains it (a cycle)")
        kids = (
            []
            if isinstance(node, yaml.ScalarNode)
            else ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value))
        )
        if done or not kids:
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            open_nodes.discard(id(node))
            continue
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


class Reader:
    """Walks a composed YAML node tree; every error names file:line and the offending value."""

    def __init__(self, path: Path, error: type[Exception]):
        self.path = path
        self.error = error
        self.lines: dict[tuple, int] = {}
        self._scalars = yaml.constructor.SafeConstructor()

    def fail(self, node, message: str):
        line = node.start_mark.line + 1 if node is not None else 1
        raise self.error(f"{self.path}:{line}: {message}")

    def mark(self, key: tuple, node) -> None:
        self.lines[key] = node.start_mark.line + 1

    def scalar(self, node, what: str):
        if isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what}: expected a single value, got a mapping")
        if isinstance(node, yaml.SequenceNode):
            self.fail(node, f"{what}: expected a single value, got a list")
        if node.tag not in (_STR, _INT, _FLOAT, _BOOL, _NULL):
            self.fail(node, f"{what}: tag {node.tag!r} is not allowed (plain strings, numbers, true/false, null)")
        try:
            value = self._scalars.construct_object(node)
        except yaml.YAMLError as exc:
            self.fail(node, f"{what}: {getattr(exc, 'problem', None) or exc} (got {node.value!r:.80})")
        except (ValueError, TypeError, OverflowError):  # a tag the value does not fit, like !!int 'abc'
            self.fail(node, f"{what}: {node.value!r:.80} is not a valid {node.tag.rsplit(':', 1)[-1]}")
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            self.fail(node, f"{what}: {node.value:.40} does not fit in 64 bits")
        return value

    def mapping(self, node, what: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        """{key: (key_node, value_node)} of a mapping with string keys from `allowed`."""
        if not isinstance(node, yaml.MappingNode) or node.tag != _MAP:
            self.fail(node, f"{what}: expected a mapping with keys {', '.join(allowed)}, got {self._show(node)}")
        out: dict[str, tuple] = {}
        for knode, vnode in node.value:
            key = self.scalar(knode, f"{what}: key")
            if key not in allowed:
                self.fail(knode, f"{what}: unknown key {key!r} (expected one of {', '.join(allowed)})")
            if key in out:
                self.fail(knode, f"{what}: key {key!r} appears twice (first on line "
                                 f"{out[key][0].start_mark.line + 1})")  # fmt: skip
            out[key] = (knode, vnode)
        for key in required:
            if key not in out:
                self.fail(node, f"{what}: {key!r} is missing")
        return out

    def pairs(self, node, what: str) -> list[tuple]:
        """(key_node, value_node) pairs of a mapping with any scalar keys (checked by the caller)."""
        if not isinstance(node, yaml.MappingNode) or node.tag != _MAP:
            self.fail(node, f"{what}: expected a mapping, got {self._show(node)}")
        seen: dict = {}
        for knode, _ in node.value:
            key = self.scalar(knode, f"{what}: key")
            if key in seen:
                self.fail(knode, f"{what}: key {key!r} appears twice (first on line {seen[key]})")
            seen[key] = knode.start_mark.line + 1
        return list(node.value)

    def sequence(self, node, what: str) -> list:
        if not isinstance(node, yaml.SequenceNode) or node.tag != _SEQ:
            self.fail(node, f"{what}: expected a list, got {self._show(node)}")
        return list(node.value)

    def string(self, node, what: str, pattern: re.Pattern | None = None, expect: str = "") -> str:
        value = self.scalar(node, what)
        if not isinstance(value, str) or not value:
            self.fail(node, f"{what}: expected {expect or 'a non-empty string'}, got {value!r}")
        if pattern is not None and not pattern.match(value):
            self.fail(node, f"{what}: expected {expect}, got {value!r}")
        return value

    def integer(self, node, what: str, lo: int | None = None, hi: int | None = None) -> int:
        value = self.scalar(node, what)
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f" {lo}..{hi}" if hi is not None else (f" >= {lo}" if lo is not None else "")
            self.fail(node, f"{what}: expected an integer{rng}, got {value!r}")
        return value

    def number(self, node, what: str, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
        value = self.scalar(node, what)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok:
            ok = (value > lo if lo_open else value >= lo) and (hi is None or value <= hi)
        if not ok:
            rng = f"> {lo}" if lo_open else f"{lo}..{hi}" if hi is not None else f">= {lo}"
            self.fail(node, f"{what}: expected a number {rng}, got {value!r}")
        return value

    @staticmethod
    def _show(node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return repr(node.value)
