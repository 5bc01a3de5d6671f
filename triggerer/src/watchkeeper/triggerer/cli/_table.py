"""The one table every ``watchkeeper`` command prints: text is shown as written.

rich parses a plain ``str`` cell, title or header as markup: an asset named ``[orders]`` (or
a schedule printed as ``[orders]``) would vanish as an unknown style tag, and ``[bold]x``
would change the look of the table. :class:`PlainTable` turns every ``str`` it is given into a
:class:`~rich.text.Text` of the escaped text (:func:`._common.printable`), so no command has
to remember to. Pass a ``Text`` for a styled cell; its text must be escaped by the caller.

This module imports rich: import it inside a handler, never at the top of a command module.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ._common import printable

__all__ = ["PlainTable", "plain"]


def plain(value: RenderableType | None) -> RenderableType | None:
    """``value`` as rich shows it without parsing markup: a ``str`` becomes escaped ``Text``;
    anything else (``Text``, another renderable, None) is returned unchanged."""
    if isinstance(value, str):
        return Text(printable(value))
    return value


class PlainTable(Table):
    """A rich :class:`~rich.table.Table` whose text cells, headers and titles are never
    parsed as markup and print escaped (control characters shown as ``\\x85``)."""

    def __init__(self, *headers: str, **options: Any) -> None:
        for key in ("title", "caption"):
            if key in options:
                options[key] = plain(options[key])
        super().__init__(**options)
        for header in headers:
            self.add_column(header)

    def add_column(self, header: RenderableType = "", *args: Any, **options: Any) -> None:
        """As :meth:`rich.table.Table.add_column`, the header shown as written."""
        super().add_column(plain(header) or "", *args, **options)

    def add_row(self, *renderables: RenderableType | None, **options: Any) -> None:
        """As :meth:`rich.table.Table.add_row`, every ``str`` cell shown as written."""
        super().add_row(*(plain(value) for value in renderables), **options)
