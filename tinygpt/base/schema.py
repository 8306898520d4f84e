"""The one schema engine: every input file and flag is a pydantic model, and its errors become our messages.

The trainer config (config.py), a spec (launch/spec/sweep.py, with its search section in launch/spec/search.py), a
cluster profile (launch/spec/profiles.py) and, read back, a sweep's manifest (launch/manifest.py) declare each
field once, with its type, bounds, choices and help, from the types below. `validate` checks
a mapping with such a model and raises one ProblemsError that lists every problem at once, each named by
its path (`resources.partitions.gpu.max_time`), with the value, what is expected, and for an unknown key
the nearest valid one.

A value is read the same way wherever it appears: a number field takes a number, or a string that is
exactly one (flags arrive as strings); a whole-number field also takes 4.0; a yes/no field takes true or
false (or the words yes/no, on/off, 1/0 as text); a text field takes text, or a number as its text; an
unset-able field takes null, or the text none (an empty text is refused). Nothing else is coerced: `True` is not 1,
`[2]` is not 2. No whole number is above INT_MAX.

Every YAML file is read by `load_yaml`, which says which file and line a syntax error is on.

This module imports no torch, and pydantic only when first imported itself: `launch.py --help` never
imports it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Le
from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Strict, ValidationError
from pydantic_core import PydanticCustomError

from tinygpt.base.errors import ProblemsError, shown_path


class Schema(BaseModel):
    """A section of an input file: unknown keys are errors, and defaults are checked too (a check between two
    fields holds when one of them is left at its default)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


# ----------------------------------------------------------------------------------------------------
# How a raw value (YAML or a flag's text) becomes a field's value: the one set of rules.

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null", "~"}
# The largest whole number any key takes (a field may declare a smaller one): the largest that JSON readers in
# every language hold exactly (the manifest, metrics.jsonl, W&B). A larger one is a mistake, not a meaning.
INT_MAX = 2**53 - 1


# The fast path first in each (a value already of its type): every field of every run of a sweep passes
# through them, defaults too, 500,000 calls in a 10,000-point dry run.


def number_from_text(value: Any) -> Any:
    """A string that is exactly a number becomes that number; anything else is left for the type to judge."""
    if type(value) is str:
        text = value.strip().replace("_", "")
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
    return value


def _whole(value: Any) -> Any:
    if type(value) is int:
        return value
    number = number_from_text(value)
    if isinstance(number, float) and number.is_integer():
        return int(number)
    return number if isinstance(number, int) else value  # (a message shows 2.5 as it was given)


def _truth(value: Any) -> Any:
    if type(value) is str and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return value


def _text(value: Any) -> Any:
    if type(value) is str and "\x00" not in value:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and "\x00" in value:  # no path, name or shell word can hold one
        raise PydanticCustomError("nul", "contains a NUL character; remove it")
    return value


def _unset(value: Any) -> Any:
    """null or the word none: unset. An empty text is refused: it reads as a value the user meant to give."""
    if type(value) is str and value.strip().lower() in _NONE:
        return None
    if type(value) is str and not value.strip():
        raise PydanticCustomError("empty", "is empty; give a value, or leave the key out (or write none) for its "
                                           "default")
    return value


def _items(value: Any) -> Any:
    """A list from YAML (`[a, b]`), or from comma-separated text (`a,b`; none or empty: no items)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE | {""}):
        return []
    if isinstance(value, str):
        return list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    return value


Int = Annotated[int, BeforeValidator(_whole), Strict(), Le(INT_MAX)]
Float = Annotated[float, BeforeValidator(number_from_text), Strict(), AllowInfNan(False)]
Bool = Annotated[bool, BeforeValidator(_truth), Strict()]
Text = Annotated[str, BeforeValidator(_text), Strict()]
OptInt = Annotated[Int | None, BeforeValidator(_unset)]
OptFloat = Annotated[Float | None, BeforeValidator(_unset)]
OptText = Annotated[Text | None, BeforeValidator(_unset)]
T = typing.TypeVar("T")
Items = Annotated[list[T], BeforeValidator(_items)]


# ----------------------------------------------------------------------------------------------------
# Errors: pydantic's, in our words.


def suggest(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean `x`?)' for the closest candidate, or ''."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""


def unknown_key(key: str, valid: Iterable[str], where: str | None = None) -> str:
    """The one wording of an unknown key: the key, the nearest valid one, every valid one."""
    valid = list(valid)
    plain = key.rpartition(".")[2].lstrip("-").replace("-", "_")
    of = f" of `{where}`" if where else ""
    return f"unknown key `{key}`{suggest(plain, valid)}; valid keys{of} are: {', '.join(valid)}"


def path_text(loc: Iterable[Any]) -> str:
    """('resources', 'partitions', 'gpu', 'max_time') -> resources.partitions.gpu.max_time; ('runs', 0) -> runs[0]."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _field_at(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, Any]:
    """The model that holds the last element of `loc`, and that field's pydantic FieldInfo (or None)."""
    holder: Any = model
    field = None
    for part in loc:
        if isinstance(part, str) and isinstance(holder, type) and issubclass(holder, BaseModel):
            field = holder.model_fields.get(part)
            if field is None:
                return holder, None
            owner, holder = holder, _inner(field.annotation)
        else:  # a list index or a mapping key: go to the item type
            args = [a for a in typing.get_args(holder) if a is not type(None)]
            owner, field, holder = None, None, _inner(args[-1]) if args else None
    return (owner if field is not None else holder), field


def _inner(annotation: Any) -> Any:
    """The model class inside `X | None`, `Annotated[X, ...]`, `list[X]` or `dict[str, X]`, else the annotation."""
    while True:
        if typing.get_origin(annotation) is Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
            continue
        return annotation


_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
           "less_than": ("<", "lt")}


def _expected(kind: str, ctx: dict) -> str | None:
    return {
        "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
        "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
        "bool_type": "true or false", "bool_parsing": "true or false",
        "string_type": "a single value (a name, a path or other text)",
        "dict_type": "a mapping of keys to values", "model_type": "a mapping of keys to values",
        "model_attributes_type": "a mapping of keys to values",
        "list_type": "a list", "tuple_type": "a list",
        "too_short": f"at least {ctx.get('min_length')} item(s)",
        "literal_error": f"one of {ctx.get('expected', '').replace(chr(39), '')}",
    }.get(kind)


def messages(err: ValidationError, model: type[BaseModel], name_of: typing.Callable[[tuple], str] = path_text,
             ) -> list[str]:
    """One message per pydantic error: `path: got VALUE; expected ...` in our words, with the field's hint."""
    out: list[str] = []
    for e in err.errors(include_url=False):
        loc, kind, value, ctx = tuple(e["loc"]), e["type"], e.get("input"), e.get("ctx") or {}
        # A union tries each member; the member's name (`int`, `constrained-str`, `function-after[...]`) is in loc.
        loc = tuple(p for p in loc if not (isinstance(p, str) and (p in ("int", "float", "str", "bool", "none")
                                                                  or "[" in p or p.startswith("constrained"))))
        holder, field = _field_at(model, loc)
        where = name_of(loc)
        if kind == "extra_forbidden":
            valid = list(holder.model_fields) if isinstance(holder, type) and issubclass(holder, BaseModel) else []
            parent = name_of(loc[:-1])
            out.append(unknown_key(where, valid, parent or None))
            continue
        if kind == "missing":
            out.append(f"{where}: is required; give a value ({field.description})" if field and field.description
                       else f"{where}: is required; give a value")
            continue
        if kind == "problem":  # (its lines name their fields themselves)
            out.extend(e["msg"].split("\n"))
            continue
        if kind in ("value_error", "nul"):
            text = str(ctx.get("error", e["msg"])).removeprefix("Value error, ")
            out.append(f"{where}: {text}" if where else text)
            continue
        hint = (field.json_schema_extra or {}).get("hint") if field and isinstance(field.json_schema_extra, dict) \
            else None
        hint = f" ({hint})" if hint else ""
        if kind in _BOUNDS:
            out.append(f"{where}: must be {_range(field, kind, ctx)}{hint}, got {_shown(value)}")
            continue
        expected = _expected(kind, ctx)
        if expected is None:
            out.append(f"{where}: {e['msg']}, got {_shown(value)}")
        else:
            out.append(f"{where}: expected {expected}{hint}, got {_shown(value)}")
    return list(dict.fromkeys(out))


def _shown(value: Any) -> str:
    if isinstance(value, str) and number_from_text(value) is not value:
        return value.strip()  # (a number given as text, as flags give every value: shown as the number it is)
    return repr(value) if isinstance(value, (str, dict, list, tuple, bool)) or value is None else str(value)


def _stated(field: Any) -> dict[str, Any]:
    """The bounds a message states: the field's, without the INT_MAX every Int has (which it states only when
    crossed)."""
    return {key: value for key, value in ends(field).items() if not (key == "le" and value == INT_MAX)}


def ends(field: Any) -> dict[str, Any]:
    """A field's declared bounds, {'ge': 0, 'lt': 1}: the one place they are read from its declaration (the
    tighter of its own and its type's: every Int's INT_MAX)."""
    found: dict[str, Any] = {}
    for m in field.metadata if field else ():
        for key in ("ge", "gt", "le", "lt"):
            if (value := getattr(m, key, None)) is not None:
                found[key] = value if key not in found else (max if key in ("ge", "gt") else min)(found[key], value)
    return found


def outside(field: Any, value: float) -> str | None:
    """The field's range in words (`from 1 to 1,000,000`, `>= 0`) when `value` is outside it (a NaN is outside
    every range), else None."""
    declared = ends(field)
    within = {"ge": lambda b: value >= b, "gt": lambda b: value > b, "le": lambda b: value <= b,
              "lt": lambda b: value < b}
    crossed = [key for key, bound in declared.items() if not within[key](bound)]  # (all of them, for a NaN)
    if not crossed:
        return None
    stated = declared if "le" in crossed else _stated(field)
    return _span(stated) or f"{_SYMBOLS[crossed[0]]} {_bound(declared[crossed[0]])}"


_SYMBOLS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def range_words(field: Any) -> str | None:
    """The range a field states (`from 1 to 4,096`, `>= 0`), without every Int's INT_MAX; None without one."""
    stated = _stated(field)
    return _span(stated) or next((f"{_SYMBOLS[k]} {_bound(v)}" for k, v in stated.items()), None)


def _range(field: Any, kind: str, ctx: dict) -> str:
    """`from 1 to 1,000`, `in [0, 1)` when the field has both ends, else `>= 1` (the end that was crossed)."""
    symbol, key = _BOUNDS[kind]
    return _span(ends(field) if ctx.get(key) == INT_MAX else _stated(field)) or f"{symbol} {_bound(ctx[key])}"


def _span(declared: dict[str, Any]) -> str | None:
    """`from 1 to 1,000`, `in [0, 1)`: a range of two ends in words; None without both."""
    low, high = declared.get("ge", declared.get("gt")), declared.get("le", declared.get("lt"))
    if low is None or high is None:
        return None
    if "ge" in declared and "le" in declared:
        return f"from {_bound(low)} to {_bound(high)}"
    return f"in {'[' if 'ge' in declared else '('}{_bound(low)}, {_bound(high)}{']' if 'le' in declared else ')'}"


def _bound(value: Any) -> str:
    """A bound as a reader writes it: 1 (not 1.0), 9,007,199,254,740,991."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


M = typing.TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, source: str | None = None, error: type[ProblemsError] = ProblemsError,
             name_of: typing.Callable[[tuple], str] = path_text) -> M:
    """`data` checked with `model`, or `error` listing every problem (named with `source`, a file's path)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(messages(err, model, name_of), source) from None


def problem(text: str) -> PydanticCustomError:
    """An error for a validator to raise whose text names the field itself (a check between two fields)."""
    return PydanticCustomError("problem", text)


def collected(check: typing.Callable[[list[str]], T]) -> T:
    """The value `check(problems)` returns, or a problem error of every line it appended (for a validator that
    calls a function in the launcher's collect-them-all style)."""
    problems: list[str] = []
    value = check(problems)
    if problems:
        raise problem("\n".join(problems))
    return value


def without(data: Any, locs: Iterable[tuple]) -> Any:
    """A copy of `data` without the values at `locs` (pydantic error locations), or without the whole top-level
    entry where the location goes through a list or names a mapping's own problem."""
    import copy

    data = copy.deepcopy(data)
    for loc in locs:
        holder, path = data, tuple(loc)
        for i, part in enumerate(path[:-1]):
            child = holder.get(part) if isinstance(holder, dict) else None
            if not isinstance(child, dict):
                path = path[:i + 1]  # (a list's item, or a value that is not a mapping: drop what holds it)
                break
            holder = child
        holder = data
        for part in path[:-1]:
            holder = holder[part]
        if path and isinstance(holder, dict):
            holder.pop(path[-1], None)
    return data


def validate_what_can_be(model: type[M], data: Any) -> tuple[M, list[str]]:
    """`data` checked with `model`: the instance made of what is valid (each value with a problem left out,
    then each section still missing a required key), and every problem's message."""
    try:
        return model.model_validate(data), []
    except ValidationError as err:
        found, locs = messages(err, model), [e["loc"] for e in err.errors()]
    for _ in range(len(max(locs, key=len)) + 1):  # (each round drops one level more of what still fails)
        data = without(data, locs)
        try:
            return model.model_validate(data), found
        except ValidationError as err:
            locs = [e["loc"][:-1] if e["type"] == "missing" else e["loc"] for e in err.errors()]
    return model.model_construct(), found


def load_yaml(path: str | Path, error: type[ProblemsError] = ProblemsError) -> Any:
    """A YAML file's contents (specs, profiles, trainer configs), each plain scalar as written unless it is its
    value's own text (see `_as_written`); a file that cannot be read, or a syntax error (with its line), is an
    `error`."""
    import yaml

    if not str(path).strip():
        raise error("the path is empty; give the path of a YAML file")
    shown = shown_path(path)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{shown}: no such file; check the path") from None
    except UnicodeDecodeError as err:
        raise error(f"{shown}: cannot be read ({err})") from None
    except OSError as err:
        raise error(f"{shown}: cannot be read ({err.strerror})") from None
    except ValueError as err:  # a NUL character in the path
        raise error(f"{str(path)!r}: not a usable file path ({err}); check the path") from None
    try:
        # libyaml where PyYAML has it (a report reads a thousand runs' configs), else PyYAML's own parser; a file
        # it refuses is parsed again by PyYAML's, whose messages are the ones users see on every machine.
        return yaml.load(text, Loader=_loaders()[0])
    except yaml.YAMLError:
        pass
    try:
        return yaml.load(text, Loader=_loaders()[1])
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None and (mark is None or start.line != mark.line):
            problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
        raise error(f"{path}:{where}: YAML syntax error: {problem}; fix the file") from None


# YAML 1.1, which PyYAML reads, takes many plain scalars for numbers, truth values and dates that their writer meant
# as text: 0755 is 493, on is true, 12:30 is 750 (base 60), 1.10 is 1.1, 1_000 is 1000, 2026-12-05 a date. A program
# would be given 493 for the 0755 its spec says, a profile's `max_time: 48:00:00` would be 172800 minutes. So a plain
# scalar is a number or a truth value only when it is written as Python writes that value (`10`, `0.001`, `1.0`,
# `true`, `false`, `.inf`: the word a program is given for it, manifest.word_of), or is a float in exponent form
# (`3.0e-4`: a number by any reading, named and given as 0.0003, as sweeps launched before named it); any other
# stays the text as written, which every typed field still reads (a number field takes the text of a number, a
# yes/no field yes/no/on/off), and which a program is given as it is.


def _as_written(loader: Any, node: Any, construct: Any, canonical: Any) -> Any:
    value = construct(loader, node)
    return value if canonical(value, node.value) else node.value


def _float_as_written(value: float, text: str) -> bool:
    return repr(value) == text or text.lower().lstrip("+-") in (".inf", ".nan") or "e" in text.lower()


def _loaders() -> tuple[type, type]:
    """The YAML loaders `load_yaml` uses: libyaml's parser where PyYAML has it, and PyYAML's own (whose messages
    users see), both constructing plain scalars as written (see above)."""
    global _LOADERS
    if _LOADERS is None:
        import yaml  # (here: `launch.py --help` imports no YAML)

        made = []
        for base in (getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader):
            loader = type(f"AsWritten{base.__name__}", (base,), {})
            safe = yaml.SafeLoader
            for tag, construct, canonical in (
                    ("int", safe.construct_yaml_int, lambda v, text: str(v) == text),
                    ("float", safe.construct_yaml_float, _float_as_written),
                    ("bool", safe.construct_yaml_bool, lambda v, text: text in ("true", "false")),
                    ("timestamp", lambda _loader, node: node.value, lambda v, text: True)):
                loader.add_constructor(f"tag:yaml.org,2002:{tag}",
                                       lambda ld, node, c=construct, k=canonical: _as_written(ld, node, c, k))
            made.append(loader)
        _LOADERS = (made[0], made[1])
    return _LOADERS


_LOADERS: tuple[type, type] | None = None


def yaml_value(text: str) -> Any:
    """One value given as text (`--set lr=0.001`) read as a spec's plain scalar is: a number, a truth value, or the
    text as written; a text that YAML cannot read, or reads as a list or mapping, stays the text."""
    import yaml

    try:
        value = yaml.load(text, Loader=_loaders()[0])
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) else text
