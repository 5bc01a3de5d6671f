"""The daemon's Settings (its own sections on top of the store's) and configure_logging."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from pydantic import ValidationError
from watchkeeper.store import ConfigFileNotFoundError, MemoryStateBackend, open_state_backend
from watchkeeper.triggerer import Settings, configure_logging, load_settings


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in an empty directory with no WATCHKEEPER__ variables from the outer environment."""
    for name in list(os.environ):
        if name.upper().startswith("WATCHKEEPER__"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield tmp_path


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
        self, _isolated: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Lists come from TOML or as JSON from the environment; env beats the file."""
        config = _isolated / "wk.toml"
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

    def test_missing_config_file(self, _isolated: Path) -> None:
        """A named config file that does not exist is an error naming it."""
        with pytest.raises(ConfigFileNotFoundError, match=r"absent\.toml"):
            load_settings(_isolated / "absent.toml")

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
