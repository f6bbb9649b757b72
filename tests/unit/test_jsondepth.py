"""The nesting limit on request bodies: exact for JSON, found without recursing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import NestingTooDeep
from gateway.ingress._prepare import parse_json
from gateway.jsondepth import MAX_JSON_DEPTH, check_yaml_depth, json_too_deep

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                     st.text(alphabet=st.sampled_from('ab[]{}"\\,: \n\t\u00e9'), max_size=8))
_DOCS = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.text(alphabet="[]{}\"\\k", max_size=3), inner, max_size=4)),
    max_leaves=60)


def depth(value: Any) -> int:
    """The nesting depth of a decoded document (iteratively: the test's own reference)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        children = node if isinstance(node, list) else (
            list(node.values()) if isinstance(node, dict) else None)
        if children is not None:
            deepest = max(deepest, level + 1)
            stack += [(child, level + 1) for child in children]
    return deepest


def nest(levels: int) -> Any:
    doc: Any = "leaf [{"
    for i in range(levels):
        doc = [doc, 1] if i % 2 else {"k]": doc, "x": "[]"}
    return doc


@settings(max_examples=400)
@given(_DOCS, st.integers(0, 12), st.booleans())
def test_the_byte_scan_agrees_with_the_decoded_depth(doc: Any, limit: int,
                                                     spaced: bool) -> None:
    """For any JSON document, any limit: too deep exactly when its depth exceeds the limit
    (brackets inside strings and escaped quotes never count)."""
    text = json.dumps(doc, indent=1 if spaced else None, ensure_ascii=False).encode()
    assert json_too_deep(text, limit=limit) == (depth(doc) > limit)


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 500])
def test_the_limit_is_exact_on_deep_documents(levels: int) -> None:
    """Documents at the limit pass, one level deeper is too deep (also past the replace
    passes' flattening)."""
    doc = nest(levels)
    assert depth(doc) == levels
    assert json_too_deep(json.dumps(doc).encode()) == (levels > MAX_JSON_DEPTH)


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"[" * 100_000,
                                  b'{"a":' * 500 + b"1" + b"}" * 500,
                                  b'{"model":"m","x":' + b"[" * 600 + b"]" * 600 + b"}"])
def test_deep_bodies_are_a_400_naming_the_limit(body: bytes) -> None:
    """500 or 100k levels (even unterminated) are refused before msgspec recurses."""
    with pytest.raises(NestingTooDeep) as info:
        parse_json(body)
    assert info.value.status == 400 and info.value.code == "json_too_deep"
    assert f"more than {MAX_JSON_DEPTH} levels" in info.value.message


def test_brackets_in_strings_do_not_count() -> None:
    """A body full of brackets inside strings is an ordinary body."""
    body = json.dumps({"model": "m", "text": "[" * 100_000, "q": '\\"[[[' * 1000}).encode()
    assert parse_json(body)["model"] == "m"


@pytest.mark.parametrize("text", ["- " * 100_000 + "1", "a:\n" + "".join(
    " " * i + "b:\n" for i in range(1, 200)) + " " * 200 + "c", "[" * 100_000])
def test_deep_yaml_is_refused_without_recursing(text: str) -> None:
    """Block- or flow-style YAML nested past the limit is refused on the event stream."""
    with pytest.raises(NestingTooDeep):
        check_yaml_depth(text.encode())


def test_yaml_aliases_are_refused_and_shallow_yaml_passes() -> None:
    """An alias (which can make a document contain itself) is refused; plain YAML passes."""
    with pytest.raises(NestingTooDeep, match="aliases"):
        check_yaml_depth(b"a: &x [1]\nb: *x\n")
    check_yaml_depth(b"apiVersion: v1\nspec:\n  rules:\n    - {uid: a, rate: {rpm: 1}}\n")
    check_yaml_depth(b"key: [unterminated\n")  # malformed: left to the loader's message
