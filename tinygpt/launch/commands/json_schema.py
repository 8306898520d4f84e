"""JSON Schema for specs and cluster profiles, written from the very models that check them.

    python launch.py schema spec            # print it
    python launch.py schema --write         # schemas/spec.schema.json and schemas/profile.schema.json

Every shipped spec and profile names its file on its first line (`# yaml-language-server: $schema=...`), so
an editor with the YAML language server validates and completes it as it is typed. A spec's `train`, `grid`
and `runs` hold the trainer's own keys, flat (`n_layer`), dotted (`model.n_layer`) or nested by section;
their schema is made here from the trainer's, as is that of the trainer keys a profile may set.

The loader is a little kinder than these files: it also takes a number written as text ("4") and a list
written as comma-separated text (flags arrive that way); an editor asks for the plain form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import schema_file

KINDS = ("spec", "profile", "status", "check", "list")
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _trainer_keys() -> tuple[dict[str, Any], dict[str, list[str]]]:
    """({flat key: its schema}, {section: its keys}) from the trainer's config."""
    from tinygpt.base.config import TrainConfig

    full = TrainConfig.model_json_schema()
    keys: dict[str, Any] = {}
    sections: dict[str, list[str]] = {}
    for section, ref in full["properties"].items():
        definition = full["$defs"][ref["$ref"].rpartition("/")[2]]
        keys.update(definition["properties"])
        sections[section] = list(definition["properties"])
    return keys, sections


def _key(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/trainer.{name}"}


def _trainer_defs() -> dict[str, Any]:
    """Each trainer key's schema once (`trainer.n_layer`), and the trainer's mappings: `trainer` (a value per
    key, flat, dotted or nested by section) and `trainer.grid` (a list of values per key, or one value)."""
    keys, sections = _trainer_keys()
    defs: dict[str, Any] = {f"trainer.{name}": schema for name, schema in keys.items()}
    one: dict[str, Any] = {}
    many: dict[str, Any] = {}
    for section, names in sections.items():
        for name in names:
            one[name] = one[f"{section}.{name}"] = _key(name)
            many[name] = many[f"{section}.{name}"] = {"anyOf": [{"type": "array", "items": _key(name), "minItems": 1},
                                                                _key(name)]}
        one[section] = {"type": "object", "properties": {name: _key(name) for name in names},
                        "additionalProperties": False, "description": f"the trainer's {section} keys"}
    defs["trainer"] = {"type": "object", "properties": one, "additionalProperties": False}
    defs["trainer.grid"] = {"type": "object", "properties": many, "additionalProperties": False}
    return defs


def spec_schema() -> dict[str, Any]:
    from tinygpt.launch.spec.sweep import LAUNCHER_KEYS, SpecFile

    schema = SpecFile.model_json_schema()
    defs = _trainer_defs()
    for key in LAUNCHER_KEYS:  # (set by the launcher: refused in a spec)
        for mapping in (defs["trainer"], defs["trainer.grid"]):
            mapping["properties"].pop(key)
            mapping["properties"].pop(f"run.{key}")
        defs["trainer"]["properties"]["run"]["properties"].pop(key)
    schema["$defs"].update(defs)
    props = schema["properties"]
    props["train"] = {"$ref": "#/$defs/trainer", "description": props["train"]["description"]}
    props["grid"] = {"$ref": "#/$defs/trainer.grid", "description": props["grid"]["description"]}
    run = defs["trainer"]["properties"]
    props["runs"] = {"type": "array", "description": props["runs"]["description"], "items": {
        "type": "object", "additionalProperties": False,
        "properties": {**run, "name": {"type": "string", "description": "the run's name (default: from its values)"}}}}
    return _finish(schema, "A tinygpt-hpc job or sweep spec (jobs/*.yaml)")


def profile_schema() -> dict[str, Any]:
    from tinygpt.launch.spec.profiles import TRAINER_KEYS, Profile

    schema = Profile.model_json_schema()
    keys, _ = _trainer_keys()
    for key in TRAINER_KEYS:
        schema["properties"][key] = {**keys[key], "description": f"trainer default: {keys[key]['description']}"}
    return _finish(schema, "A tinygpt-hpc cluster profile (hpc_lab/clusters/*.yaml)")


_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
# A number written as text, as the loader takes it (schema.py): YAML 1.1 reads 125e12 as text, for one.
NUMBER_TEXT = {"integer": r"^\s*[-+]?\d[\d_]*(\.0*)?([eE]\+?\d+)?\s*$",
               "number": r"^\s*[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"}
_KEPT_OUTSIDE = ("description", "default")


def _clean(node: Any) -> Any:
    """Without pydantic's titles (an editor shows the descriptions), with bounds that pydantic leaves in its
    own words inside a union (`ge`) in JSON Schema's (`minimum`), and with a number's text beside a number."""
    if isinstance(node, list):
        return [_clean(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {_BOUNDS.get(k, k): _clean(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node.get("type"), str) and node["type"] in NUMBER_TEXT:
        inner = {k: v for k, v in node.items() if k not in _KEPT_OUTSIDE}
        text = {"type": "string", "pattern": NUMBER_TEXT[node["type"]]}
        return {**{k: node[k] for k in _KEPT_OUTSIDE if k in node}, "anyOf": [inner, text]}
    return node


def _finish(schema: dict[str, Any], title: str) -> dict[str, Any]:
    return {"$schema": DIALECT, "title": title, **_clean({k: v for k, v in schema.items() if k != "title"})}


def document_schema(kind: str) -> dict[str, Any]:
    """What `status --json`, `check --json` or `list --json` prints: an output, so its numbers are numbers alone."""
    from tinygpt.launch.act.launch import CheckDocument
    from tinygpt.launch.status.document import SweepStatus
    from tinygpt.launch.status.listing import SweepList

    schema = {"status": SweepStatus, "check": CheckDocument, "list": SweepList}[kind].model_json_schema()
    return {"$schema": DIALECT, "title": f"The document of tinygpt-hpc's `{kind} --json`",
            **{k: v for k, v in schema.items() if k != "title"}}


def of(kind: str) -> dict[str, Any]:
    return spec_schema() if kind == "spec" else profile_schema() if kind == "profile" else document_schema(kind)


def text(kind: str) -> str:
    """The file's text: sorted keys, two-space indents, a final line break (stable for a diff)."""
    return json.dumps(of(kind), indent=2, sort_keys=True) + "\n"


def path(kind: str) -> Path:
    """Where `schema --write` writes `kind`'s: the checkout's schemas/ (an installed launcher has none)."""
    file = schema_file(kind)
    if file is None:
        raise LaunchError(f"schema --write: writes this checkout's schemas/, and this launcher is installed without "
                          f"one; print it instead: `tinygpt-launch schema {kind} > {kind}.schema.json`")
    return file
