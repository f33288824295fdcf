"""Turn pydantic's validation errors into zerosim's file / key path / expected / got messages."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from zerosim.errors import ScenarioError
from zerosim.inputs.plausible import Plausible, rule_for

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a text",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "list_type": "a list",
    "missing": "a value (this key is required)",
    "finite_number": "a finite number",
    "int_parsing_size": "an integer of plausible size",
}
OUT_OF_RANGE = ("finite_number", "int_parsing_size")
"""pydantic's errors for an infinity or a huge number: the key's plausible range says more."""


def _bound(value: Any) -> Any:
    """A range's bound as the user would write it: pydantic hands a float field's `gt=0` over
    as 0.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def _expected(error: dict[str, Any], known_keys: list[str]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(error["loc"][-1]), known_keys, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"one of the known keys ({', '.join(known_keys)}){hint}"
    if kind == "greater_than":
        return f"a number > {_bound(ctx['gt'])}"
    if kind == "greater_than_equal":
        return f"a number >= {_bound(ctx['ge'])}"
    if kind == "less_than_equal":
        return f"a number <= {_bound(ctx['le'])}"
    if kind == "less_than":
        return f"a number < {_bound(ctx['lt'])}"
    if kind in ("literal_error", "enum"):
        return f"one of {ctx.get('expected')}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "string_type" and isinstance(error.get("input"), int | float):
        return "a text (quote it: YAML reads unquoted digits as a number, 0.20 as 0.2)"
    return _EXPECTED.get(kind, error["msg"].lower())


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc[:-1]:
        field = getattr(_model_of(current), "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
    return sorted(getattr(_model_of(current), "model_fields", {}))


def _model_of(annotation: Any) -> Any:
    """The pydantic model an annotation holds, through `Model | None` (an optional section)."""
    for member in typing.get_args(annotation) or (annotation,):
        if hasattr(member, "model_fields"):
            return member
    return annotation


def validate_section(model: type[BaseModel], data: Any, *, source: str, prefix: str) -> Any:
    """Validate `data` against `model`; the first error becomes a ScenarioError."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = err.errors()
        # A misspelt key also makes the intended key "missing": report the misspelling.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(first["loc"])
        path = ".".join(str(p) for p in (prefix, *loc) if p != "")
        got = loc[-1] if first["type"] == "extra_forbidden" else first.get("input", "nothing")
        if first["type"] == "missing":
            got = "nothing"
        expected = _expected(first, _known_keys(model, loc))
        rule = rule_for(path)
        if first["type"] in OUT_OF_RANGE and isinstance(rule, Plausible):
            expected = rule.expected() + (" (a finite number)" if first["type"] ==
                                          "finite_number" else "")
        raise ScenarioError(source, path, expected, got) from None
