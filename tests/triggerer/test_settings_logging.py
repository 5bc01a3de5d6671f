"""The daemon's Settings (its own sections on top of the store's) and configure_logging."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
import structlog
from pydantic import ValidationError
from structlog.typing import EventDict, WrappedLogger
from watchkeeper.store import Asset, ConfigFileNotFoundError, MemoryStateBackend, open_state_backend
from watchkeeper.triggerer import (
    BaseEventTrigger,
    Settings,
    TriggerEvent,
    TriggerRunner,
    WatchSpec,
    configure_logging,
    load_settings,
)

from tests.support.runtime import fast

pytestmark = pytest.mark.usefixtures("isolated")


class TestSettings:
    def test_defaults(self) -> None:
        """Without a file or environment the daemon's sections have their defaults."""
        settings = load_settings()
        assert settings.triggerer.capacity == 1000
        assert settings.triggerer.watchers_path == Path("watchers")
        assert settings.triggerer.allowed_trigger_modules == []
        assert settings.triggerer.gc_interval == 3600.0
        assert (settings.logging.level, settings.logging.format) == ("info", "auto")

    def test_environment_and_file_fill_the_daemon_sections(
        self, isolated: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Lists come from TOML or as JSON from the environment; env beats the file."""
        config = isolated / "wk.toml"
        config.write_text(
            "[triggerer]\ncapacity = 10\nallowed_trigger_modules = ['mine']\n"
            "[logging]\nformat = 'json'\n"
        )
        monkeypatch.setenv("WATCHKEEPER__TRIGGERER__CAPACITY", "50")
        monkeypatch.setenv("WATCHKEEPER__LOGGING__LEVEL", "WARNING")
        settings = load_settings(config)
        assert settings.triggerer.capacity == 50
        assert settings.triggerer.allowed_trigger_modules == ["mine"]
        assert (settings.logging.level, settings.logging.format) == ("warning", "json")
        monkeypatch.setenv("WATCHKEEPER__TRIGGERER__ALLOWED_TRIGGER_MODULES", '["a", "b.c"]')
        assert load_settings(config).triggerer.allowed_trigger_modules == ["a", "b.c"]

    def test_explicit_arguments_win(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """load_settings' keyword arguments beat the environment."""
        monkeypatch.setenv("WATCHKEEPER__LOGGING__LEVEL", "debug")
        assert load_settings(logging={"level": "error"}).logging.level == "error"

    @pytest.mark.parametrize(
        ("section", "key", "value"),
        [
            ("logging", "format", "xml"),
            ("logging", "level", "loud"),
            ("triggerer", "capacity", "0"),
            ("triggerer", "gc_interval", "-1"),
        ],
    )
    def test_invalid_value_names_the_key(
        self, monkeypatch: pytest.MonkeyPatch, section: str, key: str, value: str
    ) -> None:
        """An invalid value is a ValidationError located at section.key."""
        monkeypatch.setenv(f"WATCHKEEPER__{section.upper()}__{key.upper()}", value)
        with pytest.raises(ValidationError) as caught:
            load_settings()
        assert [e["loc"][:2] for e in caught.value.errors()] == [(section, key)]

    def test_backoff_max_below_initial_is_rejected(self) -> None:
        """A restart delay cap below the first delay is a configuration error naming both."""
        with pytest.raises(ValidationError, match="backoff_max"):
            load_settings(triggerer={"backoff_initial": 10, "backoff_max": 1})

    def test_missing_config_file(self, isolated: Path) -> None:
        """A named config file that does not exist is an error naming it."""
        with pytest.raises(ConfigFileNotFoundError, match=r"absent\.toml"):
            load_settings(isolated / "absent.toml")

    def test_settings_open_the_store(self) -> None:
        """Settings is a StoreSettings, so open_state_backend accepts it."""
        settings = load_settings(database={"url": "sqlite:///:memory:"})
        assert isinstance(settings, Settings)
        assert type(open_state_backend(settings)) is MemoryStateBackend


class TestConfigureLogging:
    def test_json_lines_with_level_timestamp_and_context(self) -> None:
        """JSON format renders one object per event with level, UTC timestamp and context."""
        out = io.StringIO()
        configure_logging("info", "json", stream=out)
        log = structlog.get_logger()
        with structlog.contextvars.bound_contextvars(trigger_id="t1"):
            log.info("trigger_fired", event_count=3)
        record = json.loads(out.getvalue())
        assert record["event"] == "trigger_fired"
        assert record["level"] == "info"
        assert record["trigger_id"] == "t1"
        assert record["event_count"] == 3
        assert record["timestamp"].endswith("Z")

    def test_events_below_the_level_are_dropped(self) -> None:
        """At level warning, info events produce no output."""
        out = io.StringIO()
        configure_logging("WARNING", "json", stream=out)
        log = structlog.get_logger()
        log.info("quiet")
        log.warning("loud")
        assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["loud"]

    def test_exceptions_become_structured_tracebacks(self) -> None:
        """In JSON, an exception is rendered as data, not as a text blob."""
        out = io.StringIO()
        configure_logging("info", "json", stream=out)
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger().exception("trigger_failed")
        record = json.loads(out.getvalue())
        assert record["exception"][0]["exc_type"] == "ValueError"
        assert record["exception"][0]["exc_value"] == "boom"

    def test_auto_is_json_when_not_a_terminal(self) -> None:
        """``auto`` renders JSON to a stream that is not a tty."""
        out = io.StringIO()
        configure_logging("info", "auto", stream=out)
        structlog.get_logger().info("hello")
        assert json.loads(out.getvalue())["event"] == "hello"

    def test_console_format_is_plain_text_without_colours_off_a_tty(self) -> None:
        """``console`` renders readable lines, without ANSI codes when the stream is no tty."""
        out = io.StringIO()
        configure_logging("info", "console", stream=out)
        structlog.get_logger().info("hello", asset="orders")
        text = out.getvalue()
        assert "hello" in text
        assert "asset=orders" in text
        assert "\x1b[" not in text

    def test_unknown_level_is_rejected(self) -> None:
        """A level name logging does not know is a ValueError naming it."""
        with pytest.raises(ValueError, match="'loud'"):
            configure_logging("loud", "json", stream=io.StringIO())


def _fail_with_a_password_in_a_local() -> None:
    dsn = "postgresql://app:hunter2@db/wk"  # a local variable, as asyncpg's frames hold
    raise ConnectionError(f"cannot connect to {dsn}")


class _Writes(io.StringIO):
    """A stream that keeps each write() call's text."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


class TestWholeLines:
    def test_each_line_is_written_by_one_call(self) -> None:
        """Every event, structlog's or a stdlib record, reaches the stream as one write() of
        one whole line: a daemon killed mid-log leaves no half line for the next process's
        first line to be glued to (the chaos tests parse the log of a killed daemon)."""
        out = _Writes()
        configure_logging("debug", "json", stream=out)
        structlog.get_logger().info("from_structlog", filler="x" * 500)
        logging.getLogger("somelib").warning("from_stdlib %s", "y" * 500)
        written = [call for call in out.calls if call]
        assert len(written) == 2
        for call in written:
            assert call.endswith("\n") and call.count("\n") == 1
            json.loads(call)


class TestNoSecretsInLogs:
    @pytest.mark.parametrize("fmt", ["json", "console"])
    def test_tracebacks_show_no_local_variables(self, fmt: Literal["json", "console"]) -> None:
        """A logged exception's traceback carries no frame locals, so no DSN held in one."""
        out = io.StringIO()
        configure_logging("info", fmt, stream=out)
        try:
            _fail_with_a_password_in_a_local()
        except ConnectionError as exc:
            structlog.get_logger().error("trigger_error", exc_info=exc)
        text = out.getvalue()
        assert "_fail_with_a_password_in_a_local" in text  # the traceback is there
        assert "hunter2" not in text
        assert "app:***@db" in text  # the message survives, masked
        if fmt == "json":
            frames = json.loads(text)["exception"][0]["frames"]
            assert frames and all("locals" not in frame for frame in frames)

    def test_urls_in_event_fields_are_masked(self) -> None:
        """A URL with a password in any field, nested or not, is rendered with ``***``."""
        out = io.StringIO()
        configure_logging("info", "json", stream=out)
        structlog.get_logger().info(
            "trigger_started",
            kwargs={"url": "redis://:hunter2@cache:6379/0"},
            dsn="host=db password=s3cret",
        )
        record = json.loads(out.getvalue())
        assert record["kwargs"] == {"url": "redis://:***@cache:6379/0"}
        assert record["dsn"] == "host=db password=***"

    def test_stdlib_records_are_one_json_line(self) -> None:
        """A stdlib record (asyncpg's logger) with a traceback is one JSON object, like ours."""
        out = io.StringIO()
        configure_logging("info", "json", stream=out)
        try:
            _fail_with_a_password_in_a_local()
        except ConnectionError:
            logging.getLogger("asyncpg.pool").warning("connection lost", exc_info=True)
        logging.getLogger("asyncpg.pool").debug("below the level")
        lines = out.getvalue().splitlines()
        assert len(lines) == 1, lines
        record = json.loads(lines[0])
        assert (record["event"], record["level"], record["logger"]) == (
            "connection lost",
            "warning",
            "asyncpg.pool",
        )
        assert record["exception"][0]["exc_type"] == "ConnectionError"
        assert "hunter2" not in lines[0]

    def test_configuring_again_replaces_the_stdlib_handler(self) -> None:
        """Each call leaves one root handler, writing to the latest stream."""
        first, second = io.StringIO(), io.StringIO()
        configure_logging("info", "json", stream=first)
        configure_logging("info", "json", stream=second)
        logging.getLogger("asyncio").error("loop trouble")
        assert first.getvalue() == ""
        assert json.loads(second.getvalue())["event"] == "loop trouble"


class LeakyWatcher(BaseEventTrigger):
    """A user's watcher whose kwargs hold a password, failing with its URL in the message."""

    def __init__(self, url: str = "redis://:hunter2@cache:6379/0") -> None:
        super().__init__()
        self.url = url

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"url": self.url}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client = {"trigger": self, "url": self.url}  # locals a traceback used to show
        if client:
            raise ConnectionError(f"cannot reach {client['url']}")
        yield TriggerEvent(None)  # pragma: no cover - makes run() an async generator


class TestNoSecretsFromWatchers:
    def test_repr_masks_a_password_in_the_kwargs(self) -> None:
        """A trigger's repr shows its kwargs with a URL's password masked."""
        assert repr(LeakyWatcher()).endswith("(url='redis://:***@cache:6379/0')>")

    async def test_a_failing_watcher_leaks_its_password_nowhere(self) -> None:
        """trigger_error/trigger_failed lines and the status show the URL only masked."""
        out = io.StringIO()
        configure_logging("debug", "json", stream=out)
        failed = anyio.Event()

        def notice(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
            if event_dict.get("event") == "trigger_failed":
                failed.set()
            return event_dict

        structlog.configure(processors=[notice, *structlog.get_config()["processors"]])
        orders = Asset("orders")
        async with MemoryStateBackend() as backend:
            await backend.events.aregister_assets([orders])
            async with TriggerRunner(backend, fast(max_failures=2)) as runner:
                await runner.start_trigger(WatchSpec("leaky", LeakyWatcher(), (orders,)))
                with anyio.fail_after(5):
                    await failed.wait()
                [status] = runner.statuses()
        text = out.getvalue()
        assert [json.loads(line)["event"] for line in text.splitlines()].count("trigger_error") == 2
        assert "hunter2" not in text
        assert "redis://:***@cache:6379/0" in text
        assert status.last_error == "ConnectionError: cannot reach redis://:***@cache:6379/0"
