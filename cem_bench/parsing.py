"""YAML and JSON as cem-bench reads them from files it was given: bounded, strict, one clear error.

A configuration, a search space, a results folder's JSON: each may come from anyone, and a small one can
exhaust memory or the stack if parsed as the libraries parse by default:

* a YAML alias bomb ("billion laughs": 1 KB of anchors whose expansion holds 10⁹ values). PyYAML builds it
  as shared references, cheaply, but anything that walks it (validation, an error message that prints the
  value, JSON) expands it. Here the expanded size is counted on the composed node graph before a single
  Python object is built, and a document over :data:`MAX_NODES` values is refused;
* nesting thousands of levels deep: both parsers recurse and end in a RecursionError traceback. Refused
  at :data:`MAX_DEPTH` levels (YAML, counted on the nodes) or on the RecursionError (JSON);
* integers of thousands of digits: Python refuses to convert them (ValueError, 4300 digits) and smaller
  ones overflow a float later. Refused here at :data:`MAX_DIGITS` digits;
* a key given twice in one YAML mapping: PyYAML keeps the last silently; a typo'd copy of a key then
  decides a run without a word. Refused, naming the key and both lines;
* a file larger than any configuration (:data:`MAX_BYTES`).

Each refusal is a :class:`ParseError` (a ValueError) whose message names the limit; the callers add the
file's path and turn it into their own error type (ConfigError, SpaceError, ResultsError).
"""

from __future__ import annotations

import json
from typing import Any

MAX_BYTES = 16 << 20      # a search space or config is a few KB; results JSON (a trial's record) under 1 MB
MAX_NODES = 1_000_000     # values in a document once every alias is expanded
MAX_DEPTH = 200           # nesting levels: a space needs about 6
MAX_DIGITS = 100          # an integer's digits: float64 holds about 308 before it overflows



class ParseError(ValueError):
    """A document cem-bench will not read; the message says which limit and why."""


def _text(text: str | bytes) -> str:
    """``text`` as a string (UTF-8), refused when it is longer than any file cem-bench reads."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if len(text) > MAX_BYTES:
        raise ParseError(f"it is {len(text):,} characters long, more than the {MAX_BYTES:,} cem-bench reads from "
                         f"a configuration or results file")
    return text


def load_yaml(text: str | bytes) -> Any:
    """The document of YAML ``text`` (safe tags only: plain values, no Python objects), or ParseError."""
    import yaml

    text = _text(text)

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *base`: merged by SafeLoader below, where a key
                continue                                     # of this mapping overrides the merged one (2026-12-07)
            key = loader.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:   # an unhashable key: PyYAML's own constructor says so
                break
            if first is not None:
                raise ParseError(f"the key {_short(key)!r} appears twice in one mapping (line {first} and line "
                                 f"{key_node.start_mark.line + 1}); YAML would keep the last silently: remove one")
            seen[key] = key_node.start_mark.line + 1
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    def construct_int(loader, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_DIGITS:
            raise ParseError(f"line {node.start_mark.line + 1}: an integer of {digits:,} digits; cem-bench reads "
                             f"integers of at most {MAX_DIGITS} digits")
        return yaml.SafeLoader.construct_yaml_int(loader, node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)

    loader = Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ParseError(f"it is nested deeper than cem-bench reads (at most {MAX_DEPTH} levels)") from None
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root) -> None:
    """MAX_NODES and MAX_DEPTH on the composed graph, aliases counted as often as they are used (each
    node's expanded size memoised, so a bomb costs one pass over its few distinct nodes)."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    # iterative post-order over distinct nodes
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in size)
            continue
        size[id(node)] = 1 + sum(size[id(c)] for c in children)
        depth[id(node)] = 1 + max((depth[id(c)] for c in children), default=0)
        if size[id(node)] > MAX_NODES:
            raise ParseError(f"line {node.start_mark.line + 1}: it expands to more than {MAX_NODES:,} values "
                             f"(its aliases repeat nested content: a 'billion laughs' document); cem-bench reads at "
                             f"most {MAX_NODES:,}")
        if depth[id(node)] > MAX_DEPTH:
            raise ParseError(f"it is nested {depth[id(node)]} levels deep at line {node.start_mark.line + 1}; "
                             f"cem-bench reads at most {MAX_DEPTH} levels")


def loads_json(text: str | bytes) -> Any:
    """The value of JSON ``text``, or ParseError for a document past the limits (see the module). One parse:
    each integer goes through ``_bounded_int``, and a too-deep document ends in the RecursionError caught."""
    text = _text(text)
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ParseError(f"it is nested deeper than cem-bench reads (about {MAX_DEPTH} levels)") from None


def _bounded_int(s: str) -> int:
    """An integer of the document (inside a string, digits are just text and never come here)."""
    if len(s.lstrip("+-")) > MAX_DIGITS:
        raise ParseError(f"it holds an integer of more than {MAX_DIGITS} digits; cem-bench reads integers of at "
                         f"most {MAX_DIGITS} digits")
    return int(s)


def _short(value: Any, limit: int = 80) -> Any:
    text = repr(value)
    return value if len(text) <= limit else text[: limit - 1] + "…"


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (argparse's own message names the option and the value). Here, in a
    module without heavy imports, so that the CLI and the scripts (the GPU ones included) share it."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        import argparse
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return n


def positive_number(text: str, what: str = "number") -> float:
    """argparse type: a finite number > 0 (``float`` alone took NaN, which compares false with every bound and
    so passed every check after it, and ``inf``)."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v != float("inf")):
        import argparse
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite {what} > 0")
    return v
