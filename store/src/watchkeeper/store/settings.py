"""The store's configuration: one pydantic-settings model, read once at the entry point.

Sources, strongest first: explicit arguments (keyword arguments of the model or of
:meth:`StoreSettings.load`), the environment (``WATCHKEEPER__SECTION__KEY``), a TOML file
(``watchkeeper.toml`` in the working directory, or the file passed to ``load``), and the
defaults below. Nothing is read at import time: a model reads its sources when it is built.

The triggerer extends :class:`StoreSettings` with its own sections. A name that no model
defines is an error naming it (:class:`UnknownSettingError`, with the closest known name), from
every source: a ``[databse]`` section or a ``urll`` key in the file, a
``WATCHKEEPER__DATABSE__URL`` variable, a ``WATCHKEEPER_DATABASE_URL`` variable with one
underscore where two are meant, a misspelt keyword argument. The known names are read from the
models, so a section or key added to a model is known at once. :class:`StoreSettings` alone
(the task side) also accepts the sections the other parts of watchkeeper read
(:attr:`StoreSettings.other_sections`), so that it can share the daemon's file and environment.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._values import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_VALUE_BYTES
from .errors import StateStoreError

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_DATABASE_URL",
    "ConfigFileNotFoundError",
    "DatabaseSettings",
    "EventsSettings",
    "InvalidConfigFileError",
    "SettingOrigin",
    "StateStoreSettings",
    "StoreSettings",
    "UnknownSettingError",
    "WorkersSettings",
]

DEFAULT_CONFIG_FILE: Final = "watchkeeper.toml"
"""The TOML file read from the working directory when no file is named."""

DEFAULT_DATABASE_URL: Final = "sqlite:///watchkeeper.db"
"""An embedded database next to the working directory: no server needed."""

DottedPath = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z_][\w.]*([.:][A-Za-z_]\w*)$")]


class ConfigFileNotFoundError(StateStoreError, FileNotFoundError):
    """Raised when a configuration file named explicitly (``--config``) does not exist."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"config file {str(path)!r} does not exist")

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidConfigFileError(StateStoreError, ValueError):
    """Raised when a configuration file is not valid TOML; names the file and the position."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"config file {str(path)!r} is not valid TOML: {reason}")


class UnknownSettingError(StateStoreError, ValueError):
    """Raised when a configuration source names a section or key that no settings model has.

    ``problems`` holds one sentence per unknown name, each naming where it came from and the
    closest known name; the message joins them. A value is never shown: an unknown key may be
    a misspelt password.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


SettingOrigin = Literal["default", "file", "env", "argument"]
"""Where the value of a setting in force came from, weakest first."""


class _Section(BaseModel):
    """A ``[section]`` of the file: frozen, and an unknown key is an error naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class DatabaseSettings(_Section):
    """``[database]``: where state, assets and events live."""

    url: SecretStr = SecretStr(DEFAULT_DATABASE_URL)
    """SQLAlchemy-style URL: ``sqlite:///relative.db``, ``sqlite:////absolute/path.db``,
    ``sqlite:///:memory:`` or ``postgresql://user:password@host:port/database``."""
    statement_timeout: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    """PostgreSQL: seconds one statement may wait for its answer. Past it the statement fails
    as the store being unavailable and its connection is dropped (a network that silently
    drops a connection's bytes never answers); the caller retries on a new one. Schema
    migrations have a longer bound of their own."""


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
        hide_input_in_errors=True,  # a value may be a password; errors name keys only
    )

    other_sections: ClassVar[frozenset[str]] = frozenset({"triggerer", "logging", "worker", "api"})
    """Sections that other parts of watchkeeper read from the same file and environment. The
    task side, which reads this model alone, skips them instead of calling them unknown; the
    daemon's ``Settings`` knows every section and sets this to nothing."""

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
        """Explicit arguments, then the environment, then the TOML file, then defaults.

        Before any value is used, the environment and the file are checked for names no model
        has (:class:`UnknownSettingError`); ``__init__`` checks the arguments.
        """
        toml = TomlConfigSettingsSource(settings_cls)
        names = _Names(cls)
        problems: list[str] = []
        if isinstance(env_settings, EnvSettingsSource):
            problems += names.check_environment(env_settings.env_vars)
        if toml.toml_data:
            problems += names.check_file(toml.toml_data, Path(str(toml.toml_file_path)))
        if problems:
            raise UnknownSettingError(problems)
        return init_settings, env_settings, toml

    def __init__(self, **values: Any) -> None:
        # Keyword arguments that name no section are an error, as they are in the file.
        problems = _Names(type(self)).check_arguments(values)
        if problems:
            raise UnknownSettingError(problems)
        super().__init__(**values)

    @classmethod
    def load(cls, config_file: Path | str | None = None, **overrides: Any) -> Self:
        """Read the settings from every source; ``overrides`` are the explicit arguments.

        ``config_file`` replaces ``watchkeeper.toml``; unlike the default file it must exist
        (:class:`ConfigFileNotFoundError`). A file that is not TOML raises
        :class:`InvalidConfigFileError`; a section, key or variable that no model defines
        raises :class:`UnknownSettingError`; an invalid value raises pydantic's
        ``ValidationError``, which names the key (never the value).
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

    @classmethod
    def origins(
        cls, config_file: Path | str | None = None, **overrides: Any
    ) -> dict[str, SettingOrigin]:
        """Where each ``section.key`` of :meth:`load` with the same arguments comes from.

        ``"argument"`` for a key in ``overrides``, ``"env"`` for one a ``WATCHKEEPER__``
        variable sets, ``"file"`` for one the TOML file sets, else ``"default"``.
        """
        path = Path(config_file) if config_file is not None else Path(DEFAULT_CONFIG_FILE)
        file_data = (
            TomlConfigSettingsSource(cls, toml_file=path).toml_data if path.is_file() else {}
        )
        env_data = EnvSettingsSource(cls)()
        layers: list[tuple[SettingOrigin, Mapping[str, Any]]] = [
            ("argument", overrides),
            ("env", env_data),
            ("file", file_data),
        ]
        result: dict[str, SettingOrigin] = {}
        for section, keys in _Names(cls).sections.items():
            for key in keys:
                result[f"{section}.{key}"] = next(
                    (origin for origin, data in layers if _sets(data.get(section), key)),
                    "default",
                )
        return result


def _sets(section: object, key: str) -> bool:
    """Whether a source's value for a section (a dict, a model, or JSON text) sets ``key``."""
    if isinstance(section, str):
        try:
            section = json.loads(section)
        except ValueError:
            return False
    if isinstance(section, BaseModel):
        return key in section.model_fields_set
    return isinstance(section, Mapping) and key in section


def _closest(name: str, known: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


class _Names:
    """The sections and keys a settings model defines, read from its fields."""

    def __init__(self, cls: type[StoreSettings]) -> None:
        self.sections: dict[str, tuple[str, ...]] = {}
        for name, field in cls.model_fields.items():
            model = field.annotation
            if isinstance(model, type) and issubclass(model, BaseModel):
                self.sections[name] = tuple(model.model_fields)
        self.skipped = cls.other_sections - self.sections.keys()
        config = cls.model_config
        self.prefix = str(config.get("env_prefix", "")).lower()
        self.delimiter = str(config.get("env_nested_delimiter") or "__")

    def _unknown_section(self, name: str) -> bool:
        return name not in self.sections and name not in self.skipped

    def check_file(self, data: Mapping[str, Any], path: Path) -> list[str]:
        where = f"config file {str(path)!r}"
        problems = []
        for section, table in data.items():
            if self._unknown_section(section):
                hint = _closest(section, self.sections)
                problems.append(
                    f"{where}: unknown section [{section}]"
                    + (f"; did you mean [{hint}]?" if hint else "")
                )
            elif section in self.sections and isinstance(table, Mapping):
                known = self.sections[section]
                for key in table:
                    if key not in known:
                        hint = _closest(key, known)
                        problems.append(
                            f"{where}: unknown key {key!r} in [{section}]"
                            + (f"; did you mean {hint!r}?" if hint else "")
                        )
        return problems

    def check_arguments(self, data: Mapping[str, object]) -> list[str]:
        problems = []
        for section in data:
            if section.startswith("_"):  # pydantic-settings' own options (_env_prefix, ...)
                continue
            if self._unknown_section(section):
                hint = _closest(section, self.sections)
                problems.append(
                    f"unknown settings section {section!r} in the arguments"
                    + (f"; did you mean {hint!r}?" if hint else "")
                )
        return problems

    def check_environment(self, env_vars: Mapping[str, str | None]) -> list[str]:
        """Problems with ``WATCHKEEPER__*`` and ``WATCHKEEPER_*`` variables (names compared in
        lower case, shown in upper case)."""
        problems = []
        prefix, sep = self.prefix, self.delimiter
        full = {f"{s}{sep}{k}": (s, k) for s, keys in self.sections.items() for k in keys}
        single = {f"{s}_{k}": (s, k) for s, keys in self.sections.items() for k in keys}
        single.update({s: (s, "") for s in self.sections})
        stem = prefix.rstrip("_") + "_"  # "watchkeeper_"
        for name in sorted(env_vars):
            lowered = name.lower()
            if lowered.startswith(prefix):
                rest = lowered[len(prefix) :]
                section = rest.split(sep, 1)[0]
                if section in self.skipped:
                    continue
                if rest in full or rest in self.sections:
                    continue
                hint = _closest(rest, [*full, *self.sections])
                problems.append(
                    f"environment variable {name.upper()} names no setting"
                    + (f"; did you mean {(prefix + hint).upper()}?" if hint else "")
                )
            elif lowered.startswith(stem) and lowered[len(stem) :] in single:
                section, key = single[lowered[len(stem) :]]
                meant = prefix + section + (sep + key if key else "")
                problems.append(
                    f"environment variable {name.upper()} is not read (one underscore); "
                    f"did you mean {meant.upper()}?"
                )
        return problems
