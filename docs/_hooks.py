"""The documentation site's reference pages, written from the code as the site builds.

A page holds a marker, ``<!-- generated:NAME -->``, and this mkdocs hook replaces it with the
reference that the code itself defines: ``cli`` from the command's argument parser, ``settings``
from the settings models (each key's type, default, bounds and its docstring), ``watchers``
from the ready-made watchers' parameter models (the same, per parameter), ``http`` from the
API's OpenAPI document, ``benchmarks`` from ``BENCHMARKS.md`` (the goals and their latest
figures). So the reference cannot drift from the code; the suite checks that it names every
command, key, parameter and route (``tests/e2e/test_docs.py``).
"""

from __future__ import annotations

import argparse
import ast
import html
import inspect
import json
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

_MARKER = re.compile(r"<!-- generated:(?P<name>[a-z]+) -->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: each marker replaced by its generated reference."""
    return _MARKER.sub(lambda m: GENERATORS[m["name"]](), markdown)


# -- the command line ---------------------------------------------------------------------------


def cli_reference() -> str:
    """Every command and subcommand: its usage, its description, its options."""
    from watchkeeper.triggerer.cli import build_parser

    parser = build_parser()
    out = [_command_section(parser, "watchkeeper", level=3)]
    for name, sub in _subcommands(parser):
        out.append(_command_section(sub, f"watchkeeper {name}", level=3))
        for child, leaf in _subcommands(sub):
            out.append(_command_section(leaf, f"watchkeeper {name} {child}", level=4))
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _command_section(parser: argparse.ArgumentParser, title: str, *, level: int) -> str:
    usage = " ".join(parser.format_usage().replace("usage: ", "", 1).split())
    lines = [f"{'#' * level} `{title}`", "", "```text", usage, "```", ""]
    if parser.description:
        lines += [parser.description, ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        names = (
            ", ".join(f"`{s}`" for s in action.option_strings)
            or f"`{action.metavar or action.dest}`"
        )
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        if help_text == argparse.SUPPRESS:
            continue
        rows.append(f"| {names} | {_cell(help_text)} |")
    subs = _subcommands(parser)
    if subs:
        rows += [f"| `{name}` | {_cell(sub.description or '')} |" for name, sub in subs]
    if rows:
        lines += ["| argument | what it does |", "|---|---|", *rows, ""]
    return "\n".join(lines)


# -- the settings -------------------------------------------------------------------------------


def settings_reference() -> str:
    """Every section and key: type, default, bounds, environment variable, description."""
    from watchkeeper.triggerer.settings import Settings

    out: list[str] = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), section
        out += [f"### `[{section}]`", "", _first_paragraph(model.__doc__ or ""), ""]
        out += ["| key | type | default | what it does |", "|---|---|---|---|"]
        docs = _attribute_docs(model)
        for key, info in model.model_fields.items():
            env = f"WATCHKEEPER__{section.upper()}__{key.upper()}"
            what = docs.get(key, "")
            out.append(
                f"| `{key}` | {_cell(_type_name(info))} | {_cell(_default(info))} | "
                f"{_cell(what)}<br>env: `{env}` |"
            )
        out.append("")
        for key, info in model.model_fields.items():
            table = _table_model(info.annotation)
            if table is not None:
                out += _table_reference(f"{section}.{key}", table)
    return "\n".join(out)


def _table_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a key holding a table of sub-tables (``dict[str, Model]``), else None."""
    if typing.get_origin(annotation) is not dict:
        return None
    value = typing.get_args(annotation)[1]
    return value if isinstance(value, type) and issubclass(value, BaseModel) else None


def _table_reference(dotted: str, model: type[BaseModel]) -> list[str]:
    """The keys of each ``[dotted.<name>]`` sub-table (set in the file, or as JSON in the
    environment variable of ``dotted``)."""
    out = [f"#### `[{dotted}.<name>]`", "", _first_paragraph(model.__doc__ or ""), ""]
    out += ["| key | type | default | what it does |", "|---|---|---|---|"]
    docs = _attribute_docs(model)
    for key, info in model.model_fields.items():
        out.append(
            f"| `{key}` | {_cell(_type_name(info))} | {_cell(_default(info))} | "
            f"{_cell(docs.get(key, ''))} |"
        )
    out.append("")
    return out


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of ``model`` and of its bases, by field name."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _type_name(info: FieldInfo) -> str:
    bounds = [
        f"{op} {getattr(m, attr)}"
        for m in info.metadata
        for attr, op in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))
        if getattr(m, attr, None) is not None
    ]
    if any(getattr(m, "min_length", None) == 1 for m in info.metadata):
        bounds.append("not empty")
    code = html.escape(_type_text(info.annotation)).replace("|", "&#124;")
    return f"<code>{code}</code>" + (f" ({', '.join(bounds)})" if bounds else "")


def _type_text(annotation: Any) -> str:
    """A type as a reader writes it: ``float | None``, ``list[str]``, ``"a" | "b"``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        if set(args) == {int, float}:  # a number: an int stays an int
            return "float"
        return " | ".join(_type_text(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(map(_type_text, args))}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: object = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, SecretStr):  # a default is no secret: show it
        value = value.get_secret_value()
    return f"`{json.dumps(value, default=str)}`"


# -- the ready-made watchers -------------------------------------------------------------------


def watchers_reference() -> str:
    """Every ready-made watcher: its summary, its extra, and a row per parameter (type, bounds,
    default, its docstring), from the model that declares them."""
    import watchkeeper.watchers as package
    from watchkeeper.watchers._params import ReadyMadeWatcher

    out: list[str] = []
    for name in package.__all__:
        cls = getattr(package, name)
        if not (isinstance(cls, type) and issubclass(cls, ReadyMadeWatcher)):
            continue
        model = cls.params_model
        fields = list(model.model_fields)
        count = len(fields) if cls.positional is None else cls.positional
        out += [f"### `{name}`", "", _first_paragraph(cls.__doc__ or ""), ""]
        extra = f"the `{cls.client[1]}` extra" if cls.client else "no extra"
        by_position = ", ".join(f"`{field}`" for field in fields[:count])
        where = (
            f"Class `{cls.__module__}.{name}`, parameters `{model.__module__}.{model.__name__}`."
        )
        out += [f"Needs {extra}. By position: {by_position}; the rest by keyword. {where}", ""]
        out += ["| parameter | type | default | what it does |", "|---|---|---|---|"]
        for field, info in model.model_fields.items():
            out.append(
                f"| `{field}` | {_cell(_type_name(info))} | {_cell(_default(info))} | "
                f"{_cell(info.description or '')} |"
            )
        out.append("")
    return "\n".join(out)


# -- the HTTP API -------------------------------------------------------------------------------


def http_reference() -> str:
    """Every route and method of the OpenAPI document: summary, parameters, responses."""
    from watchkeeper.triggerer.api._openapi import openapi_document

    document = openapi_document()
    out: list[str] = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "put", "post", "delete", "patch"}:
                continue
            out += [f"### `{method.upper()} {path}`", ""]
            if operation.get("summary"):
                out += [operation["summary"], ""]
            if operation.get("description"):
                out += [operation["description"], ""]
            params = [*item.get("parameters", []), *operation.get("parameters", [])]
            params = [_resolve(document, p) for p in params]
            if params:
                out += ["| parameter | in | what it is |", "|---|---|---|"]
                out += [
                    f"| `{p['name']}` | {p['in']} | {_cell(p.get('description', ''))} |"
                    for p in params
                ]
                out.append("")
            responses = operation.get("responses", {})
            out += ["| status | meaning |", "|---|---|"]
            out += [
                f"| {code} | {_cell(_resolve(document, r).get('description', ''))} |"
                for code, r in responses.items()
            ]
            out.append("")
    return "\n".join(out)


def _resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


# -- helpers ------------------------------------------------------------------------------------


_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc):`~?\.*([^`]+)`")


def _cell(text: str) -> str:
    """``text`` on one line for a table cell, with Sphinx roles as plain code."""
    text = _ROLE.sub(r"`\1`", text)
    return " ".join(text.split()).replace("|", "\\|")


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


# -- the benchmarks -----------------------------------------------------------------------------


def benchmarks_reference() -> str:
    """``BENCHMARKS.md`` without its title and its pointer to the history (this site has both)."""
    text = (Path(__file__).resolve().parents[1] / "BENCHMARKS.md").read_text()
    body = text.split("\n", 1)[1]
    return body.split("\n## History\n", 1)[0]


GENERATORS = {
    "cli": cli_reference,
    "settings": settings_reference,
    "watchers": watchers_reference,
    "http": http_reference,
    "benchmarks": benchmarks_reference,
}
