"""config.toml and docs/configuration.md, rendered from the settings models: their fields are the only source.

`python -m tracefix.daemon.core.settings --write-config` and `--write-docs` write both files again after a field changes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
import types
import typing
from pathlib import Path, PurePath
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tracefix.daemon.core.settings import _SOURCE_DEFAULTS, ENV_PREFIX, Section, Settings

CONFIG_PATH = _SOURCE_DEFAULTS
DOCS_PATH = _SOURCE_DEFAULTS.parent / "docs" / "configuration.md"
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
WIDTH = 100

CONFIG_HEADER = f"""\
# tracefix embedded default configuration.
# Every key can be overridden by a file passed with --config (same layout, only the keys you change)
# and by environment variables named {ENV_PREFIX}<SECTION>_<KEY>, e.g. {ENV_PREFIX}COLLECTOR_HTTP_PORT=14318.
# The meaning of each key is documented on its field in daemon/core/settings.py and in docs/configuration.md.
# Generated from those fields by `python -m tracefix.daemon.core.settings --write-config`: edit the fields, not this file.
"""

DOCS_INTRO = f"""\
# Configuration

<!-- Generated from daemon/core/settings.py by `python -m tracefix.daemon.core.settings --write-docs`: edit the fields, not this file. -->

tracefix reads its settings in three layers, each overriding the one before:

1. the embedded `config.toml`, which holds every key below with its default;
2. the file passed with `--config`: the same layout, only the keys you change;
3. environment variables `{ENV_PREFIX}<SECTION>_<KEY>`, e.g. `{ENV_PREFIX}COLLECTOR_HTTP_PORT=14318`; a list or a table
   is written as JSON (`'["a", "b"]'`, `'{{"bf16": true}}'`), a list also as comma-separated words.

A setting shown as *unset* has no value unless you give one (TOML has no null); `config.toml` shows it
commented out, with an example.
"""


def toml_value(value: Any) -> str:
    """`value` as a TOML value: tables are inline, so every setting fits on its key's line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, PurePath):
        return toml_value(value.as_posix())
    if isinstance(value, str):
        # JSON's escapes are TOML's, except that TOML also forbids a raw DEL.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, BaseModel):
        return toml_value(value.model_dump(exclude_none=True))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        pairs = (f"{toml_key(str(key))} = {toml_value(item)}" for key, item in value.items() if item is not None)
        return "{ " + ", ".join(pairs) + " }"
    raise TypeError(f"{value!r} has no TOML form")


def toml_key(key: str) -> str:
    return key if BARE_KEY.match(key) else toml_value(key)


def _sections() -> list[tuple[str, Section]]:
    defaults = Settings()
    return [(name, getattr(defaults, name)) for name in Settings.model_fields]


def _doc(model: type[BaseModel]) -> str:
    """The model's own docstring on one line (pydantic models inherit none worth showing)."""
    return " ".join((model.__dict__.get("__doc__") or "").split())


def _example(field: FieldInfo) -> Any:
    return field.examples[0] if field.examples else None


def default_config_toml() -> str:
    """The embedded config.toml: every section and key with its default, from the models."""
    blocks = [CONFIG_HEADER]
    for name, section in _sections():
        lines = [f"[{name}]"]
        lines += textwrap.wrap(_doc(type(section)), WIDTH, initial_indent="# ", subsequent_indent="# ")
        for key, field in type(section).model_fields.items():
            value = getattr(section, key)
            example = _example(field)
            if value is None:
                if example is None:
                    raise ValueError(f"[{name}] {key} defaults to unset and needs examples=[...] to show in config.toml")
                lines.append(f"# {key} = {toml_value(example)}")
                continue
            if example is not None:
                lines.append(f"# e.g. {key} = {toml_value(example)}")
            lines.append(f"{key} = {toml_value(value)}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def type_name(annotation: Any) -> str:
    """A field's type in the words of a TOML user."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        return " or ".join(type_name(arg) for arg in kept) + (", optional" if len(kept) < len(args) else "")
    if origin is list:
        item = args[0] if args else Any
        if isinstance(item, type) and issubclass(item, BaseModel):
            return "list of tables"
        return f"list of {type_name(item)}s"
    if origin is dict:
        value = args[1] if len(args) == 2 else Any
        return "table" if value is Any else f"table of {type_name(value)}s"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if annotation in names:
        return names[annotation]
    return "value" if annotation is Any else getattr(annotation, "__name__", str(annotation))


BOUNDS = (
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.Lt, "lt", "<"),
)


def _bounds(field: FieldInfo) -> str:
    parts = []
    for constraint in field.metadata:
        for kind, attribute, sign in BOUNDS:
            if isinstance(constraint, kind):
                parts.append(f"{sign} {getattr(constraint, attribute)}")
        if isinstance(constraint, annotated_types.MinLen) and constraint.min_length == 1:
            parts.append("non-empty")
    return ", ".join(parts)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: a pipe would split the cell (even in a code span)."""
    return text.replace("|", "\\|")


def _prose(text: str) -> str:
    """Prose safe in Markdown: '<store dir>' would be read as an HTML tag and vanish."""
    return _cell(text).replace("<", "\\<")


def _table(model: type[BaseModel], values: BaseModel | None) -> list[str]:
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for key, field in model.model_fields.items():
        kind = type_name(field.annotation)
        if bounds := _bounds(field):
            kind += f", {bounds}"
        if field.is_required():
            default = "required"
        else:
            value = getattr(values, key) if values is not None else field.get_default(call_default_factory=True)
            default = "*unset*" if value is None else f"`{toml_value(value)}`"
        description = _prose(field.description or "")
        if (example := _example(field)) is not None:
            description += _cell(f" Example: `{key} = {toml_value(example)}`.")
        rows.append(f"| `{key}` | {_prose(kind)} | {_cell(default)} | {description} |")
    return rows


def _entry_models(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """The list-of-tables fields of a section ([[llm.custom]]) and the model of one entry."""
    entries = []
    for key, field in model.model_fields.items():
        if typing.get_origin(field.annotation) is list:
            (item,) = typing.get_args(field.annotation)
            if isinstance(item, type) and issubclass(item, BaseModel):
                entries.append((key, item))
    return entries


def configuration_markdown() -> str:
    """docs/configuration.md: every section and key with its type, default and description, from the models."""
    sections = _sections()
    lines = [DOCS_INTRO]
    lines.append("Sections: " + ", ".join(f"[`[{name}]`](#{name})" for name, _ in sections) + ".\n")
    for name, section in sections:
        lines.append(f"## `[{name}]`\n")
        if doc := _doc(type(section)):
            lines.append(_prose(doc) + "\n")
        lines.append("\n".join(_table(type(section), section)) + "\n")
        for key, entry in _entry_models(type(section)):
            lines.append(f"### `[[{name}.{key}]]` entries\n")
            if doc := _doc(entry):
                lines.append(_prose(doc) + "\n")
            lines.append("\n".join(_table(entry, None)) + "\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write config.toml and docs/configuration.md from the models, or print config.toml."""
    parser = argparse.ArgumentParser(
        prog="python -m tracefix.daemon.core.settings",
        description="Render config.toml and docs/configuration.md from the settings models.",
    )
    parser.add_argument("--write-config", action="store_true", help=f"write {CONFIG_PATH.name}")
    parser.add_argument("--write-docs", action="store_true", help="write docs/configuration.md")
    arguments = parser.parse_args(argv)
    if arguments.write_config:
        CONFIG_PATH.write_text(default_config_toml(), encoding="utf-8")
        print(f"wrote {CONFIG_PATH}")
    if arguments.write_docs:
        DOCS_PATH.write_text(configuration_markdown(), encoding="utf-8")
        print(f"wrote {DOCS_PATH}")
    if not (arguments.write_config or arguments.write_docs):
        print(default_config_toml(), end="")
    return 0
