"""The store's configuration: one pydantic-settings model, read once at the entry point.

Sources, strongest first: explicit arguments (keyword arguments of the model or of
:meth:`StoreSettings.load`), the environment (``WATCHKEEPER__SECTION__KEY``), a TOML file
(``watchkeeper.toml`` in the working directory, or the file passed to ``load``), and the
defaults below. Nothing is read at import time: a model reads its sources when it is built.

The triggerer extends :class:`StoreSettings` with its own sections; a section's unknown keys are
an error (a typo must not pass silently), while unknown *sections* are ignored so the task side
can read the same file as the daemon.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._values import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_VALUE_BYTES

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_DATABASE_URL",
    "ConfigFileNotFoundError",
    "DatabaseSettings",
    "EventsSettings",
    "InvalidConfigFileError",
    "StateStoreSettings",
    "StoreSettings",
    "WorkersSettings",
]

DEFAULT_CONFIG_FILE: Final = "watchkeeper.toml"
"""The TOML file read from the working directory when no file is named."""

DEFAULT_DATABASE_URL: Final = "sqlite:///watchkeeper.db"
"""An embedded database next to the working directory: no server needed."""

DottedPath = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z_][\w.]*([.:][A-Za-z_]\w*)$")]


class ConfigFileNotFoundError(FileNotFoundError):
    """Raised when a configuration file named explicitly (``--config``) does not exist."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"config file {str(path)!r} does not exist")

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidConfigFileError(ValueError):
    """Raised when a configuration file is not valid TOML; names the file and the position."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"config file {str(path)!r} is not valid TOML: {reason}")


class _Section(BaseModel):
    """A ``[section]`` of the file: frozen, and an unknown key is an error naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSettings(_Section):
    """``[database]``: where state, assets and events live."""

    url: SecretStr = SecretStr(DEFAULT_DATABASE_URL)
    """SQLAlchemy-style URL: ``sqlite:///relative.db``, ``sqlite:////absolute/path.db``,
    ``sqlite:///:memory:`` or ``postgresql://user:password@host:port/database``."""


class StateStoreSettings(_Section):
    """``[state_store]``: the backend and the lifecycle of task state."""

    backend: DottedPath | None = None
    """Dotted path of a :class:`BaseStateBackend` subclass; unset: chosen by ``[database] url``."""
    default_retention_days: int = Field(default=30, ge=0)
    """Task state written without explicit retention is collected this many days after its
    last update (0 disables)."""
    clear_on_success: bool = False
    """Clear a task instance's state when it succeeds (asset state is never touched)."""
    state_cleanup_batch_size: int = Field(default=0, ge=0)
    """Rows deleted per garbage-collection statement (0: one statement)."""
    max_value_bytes: int = Field(default=DEFAULT_MAX_VALUE_BYTES, gt=0)
    """Largest JSON encoding of one value."""


class EventsSettings(_Section):
    """``[events]``: how large an asset event may be and how long events are kept.

    The rule garbage collection applies is in :mod:`._gc`: an event goes once it is older than
    ``retention_days``; one that carries a dedup key also waits until it is older than
    ``dedup_retention_days``, so a redelivery inside that window is still suppressed.
    """

    max_payload_bytes: int = Field(default=DEFAULT_MAX_PAYLOAD_BYTES, gt=0)
    """Largest JSON encoding of one event's payload; a larger event fails its watcher's run."""
    retention_days: int = Field(default=30, ge=0)
    """Events older than this many days are deleted by garbage collection (0: keep forever)."""
    dedup_retention_days: int = Field(default=7, ge=0)
    """Events with a dedup key are kept at least this many days, whatever ``retention_days``
    says, so their keys keep suppressing redeliveries (0: keep them forever)."""


class WorkersSettings(_Section):
    """``[workers]``: the worker (task) side."""

    state_backend: DottedPath | None = None
    """Dotted path of a worker-side backend that offloads large values to a reference."""


class StoreSettings(BaseSettings):
    """The configuration the store needs; :class:`watchkeeper.triggerer.Settings` extends it.

    Build it with keyword arguments in tests and embeddings (``StoreSettings(database={"url":
    "sqlite:///:memory:"})``), or with :meth:`load` at an entry point.
    """

    model_config = SettingsConfigDict(
        env_prefix="WATCHKEEPER__",
        env_nested_delimiter="__",
        toml_file=DEFAULT_CONFIG_FILE,
        extra="ignore",
        frozen=True,
    )

    database: DatabaseSettings = DatabaseSettings()
    state_store: StateStoreSettings = StateStoreSettings()
    events: EventsSettings = EventsSettings()
    workers: WorkersSettings = WorkersSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Explicit arguments, then the environment, then the TOML file, then defaults."""
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)

    @classmethod
    def load(cls, config_file: Path | str | None = None, **overrides: Any) -> Self:
        """Read the settings from every source; ``overrides`` are the explicit arguments.

        ``config_file`` replaces ``watchkeeper.toml``; unlike the default file it must exist
        (:class:`ConfigFileNotFoundError`). A file that is not TOML raises
        :class:`InvalidConfigFileError`; an invalid value raises pydantic's ``ValidationError``,
        which names the key.
        """
        if config_file is None:
            try:
                return cls(**overrides)
            except tomllib.TOMLDecodeError as exc:
                raise InvalidConfigFileError(Path(DEFAULT_CONFIG_FILE), str(exc)) from exc
        path = Path(config_file)
        if not path.is_file():
            raise ConfigFileNotFoundError(path)
        # The TOML source reads its path from model_config; a throwaway subclass points it at
        # this file, and the result is rebuilt as ``cls`` so callers never see the subclass.
        reader = type(
            cls.__name__,
            (cls,),
            {
                "model_config": SettingsConfigDict(**{**cls.model_config, "toml_file": path}),
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )
        try:
            loaded = reader(**overrides)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidConfigFileError(path, str(exc)) from exc
        return cls.model_construct(
            _fields_set=set(loaded.model_fields_set),
            **{name: getattr(loaded, name) for name in cls.model_fields},
        )

    def database_url(self) -> str:
        """The ``[database] url`` in clear text (it may carry a password)."""
        return self.database.url.get_secret_value()
