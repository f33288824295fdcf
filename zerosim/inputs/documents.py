"""Parsing YAML and JSON input with limits, before anything else looks at it.

YAML is read with YAML 1.2 number rules (`5e8` is a float as users expect) and these limits:
no key twice in one mapping, at most `MAX_DEPTH` levels of nesting, at most `MAX_NODES` values
once aliases are expanded (a "billion laughs" document is refused, not expanded), no recursive
alias, number literals of at most `MAX_NUMBER_CHARS` characters and texts of at most
`MAX_TEXT_CHARS`. JSON (Hugging Face config.json) gets the same limits, and its non-standard
`NaN`/`Infinity` constants are refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import yaml

from zerosim.errors import Described, ScenarioError

MAX_DEPTH = 32
"""Levels of nesting: scenarios use 5, profiles 4, Hugging Face configs rarely more than 4."""
MAX_NODES = 100_000
"""Values in a document with its aliases expanded: a scenario has a few hundred."""
MAX_NUMBER_CHARS = 100
"""Characters in one number literal (a float's 17 significant digits fit many times)."""
MAX_TEXT_CHARS = 65_536
"""Characters in one text value."""

_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _LimitError(yaml.MarkedYAMLError):
    """A document beyond one of the limits above."""

    def __init__(self, mark: Any, expected: str, got: str):
        super().__init__(problem=f"expected {expected}, got {got}", problem_mark=mark)
        self.expected = expected
        self.got = got


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats, no duplicate keys and bounded nesting and size."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _LimitError(self.peek_event().start_mark,
                                  f"at most {MAX_DEPTH} levels of nesting", "deeper nesting")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12,
                                     list("-+0123456789."))


def _refuse_duplicate_keys(loader: _BoundedLoader, node: yaml.MappingNode) -> None:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first_line.get(key)
        except TypeError:  # an unhashable key: SafeConstructor names it
            continue
        if seen is not None:
            raise _LimitError(key_node.start_mark, "each key once in a mapping",
                              f"{_key_text(key)} again (first on line {seen})")
        first_line[key] = key_node.start_mark.line + 1


def _key_text(key: Any) -> str:
    text = repr(key) if isinstance(key, str | int | float | bool) else type(key).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _bounded_number(kind: str):
    parent = {"int": yaml.SafeLoader.construct_yaml_int,
              "float": yaml.SafeLoader.construct_yaml_float}[kind]

    def construct(loader: _BoundedLoader, node: Any) -> Any:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise _LimitError(node.start_mark, f"a number of at most {MAX_NUMBER_CHARS} "
                              "characters", f"one of {len(node.value)}")
        return parent(loader, node)

    return construct


def _bounded_text(loader: _BoundedLoader, node: Any) -> Any:
    if len(node.value) > MAX_TEXT_CHARS:
        raise _LimitError(node.start_mark, f"a text of at most {MAX_TEXT_CHARS} characters",
                          f"one of {len(node.value)}")
    return yaml.SafeLoader.construct_yaml_str(loader, node)


def _checked_timestamp(loader: _BoundedLoader, node: Any) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_timestamp(loader, node)
    except (ValueError, OverflowError):
        raise _LimitError(node.start_mark, "a valid date (or quote the text)",
                          repr(node.value[:40])) from None


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_number("int"))
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _bounded_number("float"))
_BoundedLoader.add_constructor("tag:yaml.org,2002:str", _bounded_text)
_BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", _checked_timestamp)


def _expanded_size(node: Any, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many values `node` stands for with every alias expanded (memoised per node, so a
    billion-laughs document is measured in linear time)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise _LimitError(node.start_mark, "no alias inside its own anchor", "a recursive alias")
    open_nodes.add(key)
    size = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in _children(node))
    open_nodes.discard(key)
    sizes[key] = min(size, MAX_NODES + 1)
    return sizes[key]


def _children(node: Any) -> Iterator[Any]:
    if isinstance(node, yaml.SequenceNode):
        yield from node.value
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            yield key_node
            yield value_node


def parse_yaml(text: str, source: str) -> Any:
    """The value of YAML `text`; `source` names it in errors (a file, `--set`)."""
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, set()) > MAX_NODES:
            raise _LimitError(node.start_mark, f"at most {MAX_NODES} values with aliases "
                              "expanded", "more (an alias bomb?)")
        return loader.construct_document(node)
    except _LimitError as err:
        raise ScenarioError(source, _line(err), err.expected, Described(err.got)) from None
    except yaml.YAMLError as err:
        raise ScenarioError(source, _line(err), "valid YAML", Described(_problem(err))
                            ) from None
    finally:
        if loader is not None:
            loader.dispose()


def _problem(err: yaml.YAMLError) -> str:
    problem = getattr(err, "problem", None) or str(err)
    return (problem.splitlines() or ["invalid YAML"])[0]


def _line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "<root>"


class _JsonLimit(ValueError):
    def __init__(self, key_path: str, expected: str, got: str):
        super().__init__(expected)
        self.key_path, self.expected, self.got = key_path, expected, got


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _JsonLimit(key, "each key once in an object", Described(f"{key!r} twice"))
        data[key] = value
    return data


def _json_number(convert):
    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise _JsonLimit("<root>", f"numbers of at most {MAX_NUMBER_CHARS} characters",
                             Described(f"one of {len(text)}"))
        return convert(text)

    return parse


def _json_constant(name: str) -> Any:
    raise _JsonLimit("<root>", "standard JSON (no NaN or Infinity)", Described(name))


def parse_json(text: str, source: str) -> Any:
    """The value of JSON `text`, with the limits YAML input has."""
    try:
        data = json.loads(text, object_pairs_hook=_json_object,
                          parse_int=_json_number(int), parse_float=_json_number(float),
                          parse_constant=_json_constant)
    except _JsonLimit as err:
        raise ScenarioError(source, err.key_path, err.expected, err.got) from None
    except json.JSONDecodeError as err:
        raise ScenarioError(source, f"line {err.lineno}", "valid JSON", Described(err.msg)
                            ) from None
    except RecursionError:
        raise ScenarioError(source, "<root>", f"at most {MAX_DEPTH} levels of nesting",
                            Described("deeper nesting")) from None
    check_tree_shape(data, source)
    return data


def check_tree_shape(data: Any, source: str) -> None:
    """Depth and size of a parsed tree, walked without recursion."""
    stack = [(data, 1)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise ScenarioError(source, "<root>", f"at most {MAX_DEPTH} levels of nesting",
                                Described("deeper nesting"))
        if count > MAX_NODES:
            raise ScenarioError(source, "<root>", f"at most {MAX_NODES} values",
                                Described("more"))
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            raise ScenarioError(source, "<root>", f"texts of at most {MAX_TEXT_CHARS} "
                                "characters", Described(f"one of {len(value)}"))
        children = value.values() if isinstance(value, dict) else (
            value if isinstance(value, list) else ())
        stack.extend((child, depth + 1) for child in children)


def finite(value: Any) -> bool:
    """True unless `value` is a float that is NaN or infinite."""
    return not (isinstance(value, float) and not math.isfinite(value))
