"""The daemon's configuration: the store's sections plus ``[triggerer]`` and ``[logging]``.

Build it once at the entry point with :func:`load_settings` and pass it (or its sections) down;
nothing here is read at import time. Sources, strongest first: explicit arguments, the
environment (``WATCHKEEPER__TRIGGERER__CAPACITY=50``), ``watchkeeper.toml`` or ``--config``,
defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, model_validator
from watchkeeper.store.protocols import DEFAULT_LOG_MAX_BYTES
from watchkeeper.store.settings import StoreSettings

from ._core import DEFAULT_RELOAD_INTERVAL, LOG_LEVELS
from .runtime import SupervisionSettings

__all__ = [
    "DEFAULT_RELOAD_INTERVAL",
    "LOG_LEVELS",
    "ApiSettings",
    "HookSettings",
    "LogLevel",
    "LoggingSettings",
    "Settings",
    "TriggererSettings",
    "WorkerSettings",
    "load_settings",
]


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


LogLevel = Annotated[
    Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(_lower)
]

PositiveSeconds = Annotated[float, Field(gt=0)]


class _Section(BaseModel):
    """A ``[section]`` of the file: frozen, and an unknown key is an error naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class _LeasedSection(_Section):
    """A section whose process renews leases every ``heartbeat_interval``: the lease time to
    live in force, and the rule that it outlasts a heartbeat, are written here once."""

    if TYPE_CHECKING:  # fields of each subclass, documented there
        heartbeat_interval: float
        lease_ttl: float | None

    @property
    def lease_seconds(self) -> float:
        """The lease time to live in force: ``lease_ttl``, or three heartbeats."""
        return self.lease_ttl if self.lease_ttl is not None else 3 * self.heartbeat_interval

    @model_validator(mode="after")
    def _check_lease(self) -> Self:
        if self.lease_ttl is not None and self.lease_ttl <= self.heartbeat_interval:
            raise ValueError(
                f"lease_ttl ({self.lease_ttl}) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}): a lease would lapse between two renewals"
            )
        return self


class TriggererSettings(SupervisionSettings, _Section):
    """``[triggerer]``: what the daemon runs and how it supervises it.

    The supervision keys (``capacity``, ``backoff_*``, ``max_failures``, ``cleanup_timeout``,
    ``stop_grace``, ``lag_threshold``) are :class:`~.runtime._config.SupervisionSettings`', shared with
    :class:`~watchkeeper.triggerer.RunnerConfig`; the others are the daemon's own.
    """

    watchers_path: Path = Path("watchers")
    """Directory of Python files that declare assets and their watchers (like a DAGs folder)."""
    allowed_trigger_modules: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Module prefixes trigger classes may be imported from. Empty: the modules of the
    watchers path and ``watchkeeper.watchers``."""
    reload_interval: PositiveSeconds = DEFAULT_RELOAD_INTERVAL
    """Seconds between two scans of the watchers path for changed files."""

    import_timeout: PositiveSeconds = 30.0
    """Seconds one watcher file may take to import (its triggers' ``__init__`` and
    ``serialize()`` included); past it the file is refused and the others load."""
    heartbeat_interval: PositiveSeconds = 5.0
    """Seconds between the daemon's heartbeats (status saves)."""
    lease_renew_interval: PositiveSeconds = 1.0
    """Seconds between two renewals of the daemon's node lease (one row, whatever the number
    of watchers); each renewal also reaps the node leases of dead daemons."""
    lease_ttl: PositiveSeconds | None = None
    """Seconds the node lease lasts without renewal, on the database's clock; another daemon
    takes the watchers over that long after their daemon died. None: three renewals. Must
    exceed lease_renew_interval."""
    lease_margin: PositiveSeconds | None = None
    """Seconds before its node lease could expire that a daemon that could not renew it stops
    its own watchers (measured on its monotonic clock from the last renewal it sent). None:
    half a renewal interval. Must be below lease_ttl minus lease_renew_interval."""
    gc_interval: float = Field(default=3600.0, ge=0)
    """Seconds between garbage-collection passes inside the daemon (0 disables)."""
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The event loop the command line runs the daemon on: ``auto`` is uvloop when it is
    installed (the ``uvloop`` extra), else asyncio's; ``uvloop`` is an error without it."""

    @property
    def lease_seconds(self) -> float:
        """The node lease's time to live in force: ``lease_ttl``, or three renewals."""
        return self.lease_ttl if self.lease_ttl is not None else 3 * self.lease_renew_interval

    @model_validator(mode="after")
    def _check_lease(self) -> Self:
        if self.lease_ttl is not None and self.lease_ttl <= self.lease_renew_interval:
            raise ValueError(
                f"lease_ttl ({self.lease_ttl}) must exceed lease_renew_interval "
                f"({self.lease_renew_interval}): a lease would lapse between two renewals"
            )
        room = self.lease_seconds - self.lease_renew_interval
        if self.lease_margin is not None and self.lease_margin >= room:
            raise ValueError(
                f"lease_margin ({self.lease_margin}) must be below lease_ttl minus "
                f"lease_renew_interval ({room:g}): the daemon would stop its watchers "
                "before its next renewal is due"
            )
        return self

    @property
    def lease_margin_seconds(self) -> float:
        """The margin in force: ``lease_margin``, or half a renewal interval."""
        margin = self.lease_margin
        return margin if margin is not None else self.lease_renew_interval / 2


class WorkerSettings(_LeasedSection):
    """``[worker]``: ``watchkeeper worker``, which runs the tasks declared with ``asset_task``."""

    concurrency: int = Field(default=8, ge=1)
    """Runs one worker holds at once, claimed and not yet recorded (sync tasks run in that
    many threads)."""
    poll_interval: PositiveSeconds = 0.05
    """Seconds between two looks for new events (SQLite: other processes commit into the
    file; PostgreSQL: only when its LISTEN connection is lost) and for due retries."""
    heartbeat_interval: PositiveSeconds = 5.0
    """Seconds between two renewals of the leases of the runs a worker executes."""
    isolation: Literal["none", "process"] = "none"
    """Where a try runs unless its task says (``asset_task(isolation=...)``): ``none``, in
    the worker's process (a sync task in a thread, an async one on the loop); ``process``, in
    a child process of a pool of ``concurrency`` (see the tasks guide)."""
    process_memory_limit_mb: int | None = Field(default=None, ge=16)
    """Address space a try's child process may use, in MiB (``RLIMIT_AS``; Linux and other
    POSIX systems): past it the try fails with ``MemoryError``. None: no limit."""
    callback_timeout: PositiveSeconds = 30.0
    """Seconds a task's ``on_success``/``on_failure``/``on_retry`` callback may take; a slower
    one is cancelled (async) or abandoned (sync) and logged. The slot that ran the try waits
    for its callback before running its next run."""
    lease_ttl: PositiveSeconds | None = None
    """Seconds a run's lease lasts without renewal; a killed worker's run is retried that long
    after (at once when a worker on the same host finds its process gone). None: three
    heartbeats. Must exceed the heartbeat."""
    log_max_bytes: int = Field(default=DEFAULT_LOG_MAX_BYTES, ge=0)
    """Bytes of output (stdout, stderr, log records) each try keeps with its run: past it, the
    oldest go and the tail is kept. 0: no logs are kept, a task's output goes to the worker's
    own streams."""
    reload_interval: PositiveSeconds = DEFAULT_RELOAD_INTERVAL
    """Seconds between two scans of the definition files for changed tasks (``watchkeeper
    worker`` and ``up``): a changed task's code applies to the runs claimed after the reload,
    a task gone from the files gets no new runs."""


class HookSettings(_Section):
    """``[api.hooks.<asset>]``: an asset that takes webhooks signed by a sender's secret at
    ``POST /hooks/<asset>`` (a token with ``push:asset:<asset>`` needs no entry here).

    The secret is ``secret`` itself, or read from the environment variable ``secret_env``
    names (when the settings load: a missing variable is an error naming it). Either way it
    is a :class:`~pydantic.SecretStr`: never shown, logged or put in an error.
    """

    provider: Literal["github", "stripe", "hmac"]
    """Whose signature scheme: ``github`` (``X-Hub-Signature-256``, delivery id from
    ``X-GitHub-Delivery``), ``stripe`` (``Stripe-Signature`` with its signed timestamp, the
    event id of the body), or ``hmac`` (``sha256=<hex>`` of the body in ``signature_header``,
    the delivery id from ``delivery_header``)."""
    secret: SecretStr | None = None
    """The shared secret the sender signs with."""
    secret_env: str | None = Field(default=None, min_length=1)
    """The environment variable holding the secret (instead of ``secret``)."""
    tolerance: float = Field(default=300.0, gt=0)
    """``stripe``: seconds a signed timestamp may be away from now (older: a replay)."""
    signature_header: str = Field(default="X-Signature-256", min_length=1)
    """``hmac``: the header carrying ``sha256=<hex digest>`` of the body."""
    delivery_header: str = Field(default="Idempotency-Key", min_length=1)
    """``hmac``: the header carrying the delivery id (the dedup key); optional in requests."""

    @model_validator(mode="after")
    def _check_secret(self) -> Self:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError("set either secret or secret_env (the variable holding it)")
        if self.secret_env is not None and not os.environ.get(self.secret_env):
            raise ValueError(f"secret_env names {self.secret_env!r}, which is not set or empty")
        if self.secret is not None and not self.secret.get_secret_value():
            raise ValueError("secret is empty")
        return self

    def secret_bytes(self) -> bytes:
        """The secret as the HMAC key (from ``secret_env``'s variable when named)."""
        if self.secret is not None:
            return self.secret.get_secret_value().encode()
        return os.environ.get(self.secret_env or "", "").encode()


class ApiSettings(_Section):
    """``[api]``: the HTTP API, metrics, health checks and web page the daemon serves."""

    enabled: bool = True
    """Serve the API inside ``watchkeeper triggerer`` (``watchkeeper api`` always serves it)."""
    host: str = Field(default="127.0.0.1", min_length=1)
    """Address to listen on (``0.0.0.0``: every interface)."""
    port: int = Field(default=8787, ge=0, le=65535)
    """TCP port to listen on (0: any free port, logged at start)."""
    max_watcher_series: int = Field(default=2000, ge=0)
    """Most watchers with their own series in ``/metrics``; the rest are counted in the
    unlabelled totals (``watchkeeper_watchers``) and in ``watchkeeper_watcher_series_dropped``."""
    max_streams_per_token: int = Field(default=20, ge=1)
    """Most live event streams one token holds open at once; one more is answered 429."""
    metrics_token_required: bool = False
    """``/metrics`` needs a token with read scope (it names every asset, watcher and task)."""
    max_connections: int = Field(default=1024, ge=1)
    """Most HTTP connections open at once (lowered to fit the open-file limit with a reserve for
    the store and the watchers); one more closes the connection idle longest."""
    header_timeout: float = Field(default=10.0, gt=0)
    """Seconds a connection has to send a request's headers; a slower one is closed."""
    tls_certfile: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; with ``tls_keyfile``. Unset: plain HTTP."""
    tls_keyfile: Path | None = None
    """PEM private key of ``tls_certfile``."""
    watcher_sample_seconds: float = Field(default=60.0, ge=0.05)
    """Seconds between two samples of the watchers' event rate, last-event age and state for
    the page's watcher view (the last hour is kept in memory)."""
    hooks: dict[Annotated[str, Field(min_length=1)], HookSettings] = Field(default_factory=dict)
    """The assets that take signed webhooks at ``POST /hooks/<asset>``, by asset name."""

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("set both tls_certfile and tls_keyfile to serve HTTPS, or neither")
        return self


class LoggingSettings(_Section):
    """``[logging]``: structlog's level and renderer."""

    level: LogLevel = "info"
    format: Literal["auto", "json", "console"] = "auto"
    """``auto``: JSON when stderr is not a terminal, coloured console lines when it is."""


class Settings(StoreSettings):
    """Everything the ``watchkeeper`` command and the daemon read."""

    other_sections: ClassVar[frozenset[str]] = frozenset()  # every section is a field here

    triggerer: TriggererSettings = TriggererSettings()
    worker: WorkerSettings = WorkerSettings()
    logging: LoggingSettings = LoggingSettings()
    api: ApiSettings = ApiSettings()


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build :class:`Settings` from every source; ``overrides`` beat all of them.

    :param config_file: the TOML file to read instead of ``./watchkeeper.toml`` (it must exist).
    :param overrides: values nested like the file, e.g.
        ``load_settings(database={"url": "sqlite:///state.db"})``.
    :returns: the settings.
    :raises pydantic.ValidationError: a value out of its rules, naming the setting.
    """
    return Settings.load(config_file, **overrides)
