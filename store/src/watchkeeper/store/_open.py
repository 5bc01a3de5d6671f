"""``open_state_backend``: build the backend the settings name, unopened.

``[state_store] backend`` (a dotted class path) wins when set; otherwise the scheme of
``[database] url`` picks a built-in backend, following SQLAlchemy's URL convention:

- ``sqlite:///relative/path.db`` (three slashes: relative to the working directory),
  ``sqlite:////absolute/path.db`` (four slashes), ``sqlite:///:memory:`` (process memory);
- ``postgresql://…``, ``postgres://…``, ``postgresql+asyncpg://…``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from ._backend import BaseStateBackend
from ._redact import redact_dsn
from .errors import ArgumentTypeError, BackendImportError, InvalidSettingError
from .memory import MemoryStateBackend

if TYPE_CHECKING:
    from .settings import StoreSettings

__all__ = ["backend_class_from_path", "open_state_backend"]

_SQLITE_SCHEMES = frozenset({"sqlite", "sqlite+aiosqlite"})
_POSTGRES_SCHEMES = frozenset({"postgresql", "postgres", "postgresql+asyncpg"})
_MEMORY_PATHS = frozenset({"", ":memory:"})


def open_state_backend(settings: StoreSettings) -> BaseStateBackend:
    """Return the configured backend, not yet opened: use it as ``async with backend:``.

    Raises ``ValueError`` naming an unknown URL scheme, ``ImportError`` naming a
    ``[state_store] backend`` path that cannot be imported, and ``TypeError`` naming one that
    is not a :class:`BaseStateBackend` subclass.
    """
    max_value_bytes = settings.state_store.max_value_bytes
    max_payload_bytes = settings.events.max_payload_bytes
    if settings.state_store.backend is not None:
        cls = backend_class_from_path(settings.state_store.backend)
        backend = cls(max_value_bytes=max_value_bytes)
        # Set, not passed: a custom backend's constructor may predate [events].
        backend.max_payload_bytes = max_payload_bytes
        return backend
    url = settings.database_url()
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise InvalidSettingError(
            "[database] url",
            "is not a URL (it has no 'scheme://'); expected e.g. "
            "'sqlite:///watchkeeper.db' or 'postgresql://user@host/database'",
        )
    if scheme in _SQLITE_SCHEMES:
        path = sqlite_path_from_url(url)
        if path is None:
            return MemoryStateBackend(
                max_value_bytes=max_value_bytes, max_payload_bytes=max_payload_bytes
            )
        try:
            from .sqlite import SqliteStateBackend
        except ImportError as exc:
            raise BackendImportError("the SQLite backend", f"cannot be imported: {exc}") from exc
        return SqliteStateBackend(
            path, max_value_bytes=max_value_bytes, max_payload_bytes=max_payload_bytes
        )
    if scheme in _POSTGRES_SCHEMES:
        try:
            from .postgres import PostgresStateBackend
        except ImportError as exc:
            raise BackendImportError(
                "the PostgreSQL backend",
                f"cannot be imported ({exc}); "
                "install it with 'pip install watchkeeper-store[postgres]'",
            ) from exc
        # asyncpg understands postgresql:// and postgres://, not SQLAlchemy's driver suffix.
        dsn = url if scheme != "postgresql+asyncpg" else f"postgresql://{rest}"
        return PostgresStateBackend(
            dsn,
            max_value_bytes=max_value_bytes,
            max_payload_bytes=max_payload_bytes,
            statement_timeout=settings.database.statement_timeout,
        )
    raise InvalidSettingError(
        "[database] url",
        f"has the unknown scheme {scheme!r}; "
        "use sqlite:///path.db, sqlite:///:memory: or postgresql://...",
    )


def sqlite_path_from_url(url: str) -> Path | None:
    """The database file of a ``sqlite://`` URL, or ``None`` for an in-memory database.

    ``sqlite:///state.db`` is ``state.db`` relative to the working directory;
    ``sqlite:////var/lib/wk/state.db`` is ``/var/lib/wk/state.db``. A query string
    (``?mode=...``) is not supported and is an error rather than part of the file name.
    """
    shown = redact_dsn(url)  # what an error may quote: never a password
    _, sep, rest = url.partition("://")
    if not sep:
        raise InvalidSettingError(repr(shown), "is not a sqlite:// URL")
    host, slash, path = rest.partition("/")
    if host:
        raise InvalidSettingError(
            f"sqlite URL {shown!r}",
            f"names a host {host.rpartition('@')[2]!r}; use "
            "sqlite:///relative.db or sqlite:////absolute/path.db",
        )
    if "?" in path:
        raise InvalidSettingError(
            f"sqlite URL {shown!r}", "has a query string, which is not supported"
        )
    if not slash or path in _MEMORY_PATHS:
        return None
    return Path(path)


def backend_class_from_path(dotted: str) -> type[BaseStateBackend]:
    """Import ``package.module.Class`` (or ``package.module:Class``) and check its type."""
    module_name, sep, attr = dotted.partition(":")
    if not sep:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise BackendImportError(
            f"[state_store] backend {dotted!r}", "is not a dotted path like 'package.module.Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendImportError(
            f"[state_store] backend {dotted!r}", f"cannot be imported: {exc}", module=module_name
        ) from exc
    try:
        cls = getattr(module, attr)
    except AttributeError as exc:
        raise BackendImportError(
            f"[state_store] backend {dotted!r}:",
            f"module {module_name!r} has no attribute {attr!r}",
            module=module_name,
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseStateBackend)):
        raise ArgumentTypeError(
            f"[state_store] backend {dotted!r}", cls, "a BaseStateBackend subclass"
        )
    return cls
