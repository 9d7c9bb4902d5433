"""`when` trees: validated once and compiled into closures, NetBox-style (a whitelist of operators).

A tree is ``{"all": [...]}``, ``{"any": [...]}``, ``{"not": {...}}`` or a leaf (see operators.py
for the operators' semantics). A compiled :class:`Condition` has a fast ``test(facts) -> bool`` for
the match path and a separate ``explain(facts) -> str | None`` that says in plain words which leaf
failed; the trace calls ``explain`` only when it needs the words, so matching builds no strings.
``all``/``any`` need at least one condition (leave ``when`` out to always match); trees nest at
most 32 levels deep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from routing.engine.errors import RuleError, RuleErrors
from routing.engine.operators import (
    Condition,
    Facts,
    Guard,
    compile_leaf,
    no_failure,
    type_name,
)

MAX_DEPTH = 32


def _always(facts: Facts) -> bool:
    return True


ALWAYS = Condition(test=_always, explain=no_failure, text="always")


def compile_condition(
    node: Any, *, value_lists: Mapping[str, Iterable[str]], path: str = "when"
) -> Condition:
    """Validate and compile a `when` tree (None = always); raises RuleErrors with every problem."""
    errors: list[RuleError] = []
    condition = compile_condition_into(node, value_lists=value_lists, path=path, errors=errors)
    if errors or condition is None:
        raise RuleErrors(errors or [RuleError(path, "invalid condition")])
    return condition


def compile_condition_into(
    node: Any,
    *,
    value_lists: Mapping[str, Iterable[str]],
    path: str,
    errors: list[RuleError],
) -> Condition | None:
    """Like compile_condition, but appends its errors to ``errors`` (None when any were found)."""
    if node is None:
        return ALWAYS
    before = len(errors)
    folded_lists: dict[str, frozenset[str]] = {}
    condition = _compile(node, path, value_lists, folded_lists, errors, 0)
    return condition if len(errors) == before else None


def _compile(
    node: Any,
    path: str,
    value_lists: Mapping[str, Iterable[str]],
    folded_lists: dict[str, frozenset[str]],
    errors: list[RuleError],
    depth: int,
) -> Condition | None:
    if depth > MAX_DEPTH:
        errors.append(RuleError(path, f"conditions nested deeper than {MAX_DEPTH} levels"))
        return None
    if not isinstance(node, Mapping):
        errors.append(RuleError(path, f"must be an object, got {type_name(node)}"))
        return None
    for combinator in ("all", "any", "not"):
        if combinator in node:
            if len(node) != 1:
                extra = sorted(str(key) for key in node if key != combinator)
                errors.append(
                    RuleError(path, f'"{combinator}" must stand alone, found also {extra}')
                )
                return None
            sub_path = f"{path}.{combinator}"
            if combinator == "not":
                inner = _compile(
                    node["not"], sub_path, value_lists, folded_lists, errors, depth + 1
                )
                return None if inner is None else _negation(inner)
            children = node[combinator]
            if not isinstance(children, list):
                errors.append(
                    RuleError(sub_path, f"must be a list of conditions, got {type_name(children)}")
                )
                return None
            if not children:
                errors.append(
                    RuleError(
                        sub_path,
                        "must list at least one condition (leave `when` out to always match)",
                    )
                )
                return None
            compiled = [
                _compile(child, f"{sub_path}[{i}]", value_lists, folded_lists, errors, depth + 1)
                for i, child in enumerate(children)
            ]
            parts = [c for c in compiled if c is not None]
            if len(parts) != len(compiled):
                return None
            return _conjunction(parts) if combinator == "all" else _disjunction(parts)
    return compile_leaf(node, path, value_lists, folded_lists, errors)


# --- combinators -------------------------------------------------------------------------------


def _conjunction(parts: list[Condition]) -> Condition:
    if len(parts) == 1:
        return parts[0]
    tests = tuple(part.test for part in parts)
    explains = tuple(part.explain for part in parts)
    if len(tests) == 2:
        first, second = tests

        def test(facts: Facts) -> bool:
            return first(facts) and second(facts)

    else:

        def test(facts: Facts) -> bool:
            # A plain loop: all() would build a generator on every evaluation of the hot path.
            for part in tests:  # noqa: SIM110
                if not part(facts):
                    return False
            return True

    def explain(facts: Facts) -> str | None:
        for part in explains:
            failure = part(facts)
            if failure is not None:
                return failure
        return None

    # The smallest guard is the most selective one to index by.
    guards = [part.guard for part in parts if part.guard is not None]
    guard = min(guards, key=lambda g: len(g[1])) if guards else None
    text = " and ".join(_grouped(part.text) for part in parts)
    return Condition(test=test, explain=explain, text=text, guard=guard)


def _disjunction(parts: list[Condition]) -> Condition:
    if len(parts) == 1:
        return parts[0]
    tests = tuple(part.test for part in parts)
    explains = tuple(part.explain for part in parts)

    def test(facts: Facts) -> bool:
        for part in tests:  # noqa: SIM110 - no generator on the hot path
            if part(facts):
                return True
        return False

    def explain(facts: Facts) -> str | None:
        failures = []
        for part in explains:
            failure = part(facts)
            if failure is None:
                return None
            failures.append(failure)
        return "none of these held: " + "; ".join(failures)

    # Indexable only when every branch is guarded on the same field: then the union is a promise.
    guard: Guard | None = None
    guards = [part.guard for part in parts]
    first_guard = guards[0]
    if first_guard is not None and all(g is not None and g[0] == first_guard[0] for g in guards):
        guard = (first_guard[0], frozenset().union(*(g[1] for g in guards if g is not None)))
    text = " or ".join(_grouped(part.text) for part in parts)
    return Condition(test=test, explain=explain, text=text, guard=guard)


def _negation(inner: Condition) -> Condition:
    inner_test = inner.test
    message = f"{inner.text} holds, so `not` fails"

    def test(facts: Facts) -> bool:
        return not inner_test(facts)

    def explain(facts: Facts) -> str | None:
        return message if inner_test(facts) else None

    return Condition(test=test, explain=explain, text=f"not {_grouped(inner.text)}")


def _grouped(text: str) -> str:
    return f"({text})" if " and " in text or " or " in text else text
