"""``watchkeeper config show``: every setting in force, and where its value came from.

Each ``section.key`` of :class:`~watchkeeper.triggerer.settings.Settings` is listed with its
value and its source: ``argument`` (a global option such as ``--database-url``), ``env`` (a
``WATCHKEEPER__SECTION__KEY`` variable), ``file`` (the TOML file) or ``default``. Passwords
are masked: the database URL is shown by :func:`~watchkeeper.store.protocols.redact_dsn`, every other
text by :func:`~watchkeeper.store.protocols.redact_secrets`. Nothing is opened; the command only reads
the configuration, so it is the first thing to run when a daemon uses the wrong database.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ._common import compact_json, console, emit_json, json_flag, settings_overrides

__all__ = ["register", "settings_in_force"]

if TYPE_CHECKING:
    from watchkeeper.store.settings import SettingOrigin

    from ..settings import Settings

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def _shown(value: object) -> Any:
    """A setting's value as JSON data, with any password masked (a secret inside a table,
    such as a webhook's, is not shown at all)."""
    from pydantic import BaseModel, SecretStr
    from watchkeeper.store.protocols import redact_dsn, redact_secrets

    if isinstance(value, SecretStr):
        return redact_dsn(value.get_secret_value())
    if isinstance(value, BaseModel):
        return {
            key: "**********" if isinstance(item, SecretStr) else _shown(item)
            for key, item in value
        }
    if isinstance(value, dict):
        return {str(key): _shown(item) for key, item in value.items()}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, list | tuple):
        return [_shown(item) for item in value]
    return value


def settings_in_force(
    settings: Settings, origins: dict[str, SettingOrigin]
) -> dict[str, dict[str, Any]]:
    """``{"section.key": {"value": ..., "source": ...}}`` for every key, in model order."""
    from pydantic import BaseModel

    rows: dict[str, dict[str, Any]] = {}
    for name in type(settings).model_fields:
        section = getattr(settings, name)
        if not isinstance(section, BaseModel):
            continue
        for key in type(section).model_fields:
            dotted = f"{name}.{key}"
            rows[dotted] = {
                "value": _shown(getattr(section, key)),
                "source": origins.get(dotted, "default"),
            }
    return rows


def _config_file(args: argparse.Namespace) -> str | None:
    from watchkeeper.store.settings import DEFAULT_CONFIG_FILE

    if args.config is not None:
        return str(args.config)
    return DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).is_file() else None


def _show(args: argparse.Namespace, settings: Settings) -> int:
    origins = type(settings).origins(args.config, **settings_overrides(args))
    rows = settings_in_force(settings, origins)
    config_file = _config_file(args)
    if args.json:
        emit_json({"config_file": config_file, "settings": rows})
        return 0
    from rich.text import Text

    from ._table import PlainTable

    table = PlainTable(
        title=f"watchkeeper settings (config file: {config_file or 'none'})",
        title_justify="left",
    )
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", no_wrap=True)
    for dotted, row in rows.items():
        source = row["source"]
        table.add_row(
            dotted,
            compact_json(row["value"]),
            Text(source, style="dim" if source == "default" else "bold"),
        )
    console().print(table)
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``config show`` to the ``watchkeeper`` parser."""
    config = subparsers.add_parser(
        "config",
        help="show the settings in force and where each came from",
        description="Inspect the configuration (file, environment, options, defaults).",
    )
    actions = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="every setting, its value (passwords masked) and its source",
        description=(
            "Print every setting in force with its source: argument (a global option), env "
            "(WATCHKEEPER__SECTION__KEY), file (the TOML file) or default."
        ),
    )
    json_flag(show, "the settings")
    show.set_defaults(handler=_show)
