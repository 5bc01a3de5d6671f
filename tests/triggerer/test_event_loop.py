"""``[triggerer] event_loop``: which loop the daemon runs on, and the runtime tests on uvloop."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from pydantic import ValidationError
from watchkeeper.triggerer import TriggererSettings
from watchkeeper.triggerer._core._event_loop import EventLoopUnavailableError, uses_uvloop
from watchkeeper.triggerer.cli._common import UsageError, run_async

from tests.support.requires import unavailable

ALSO_ON_UVLOOP = True

UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


class TestEventLoopSetting:
    def test_auto_is_the_default(self) -> None:
        """``event_loop`` defaults to ``auto``; a value that is no loop is a settings error."""
        assert TriggererSettings().event_loop == "auto"
        assert TriggererSettings(event_loop="asyncio").event_loop == "asyncio"
        with pytest.raises(ValidationError, match="event_loop"):
            TriggererSettings(event_loop="trio")  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("event_loop", "module"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")]
    )
    def test_the_command_runs_on_the_loop_named(self, event_loop: str, module: str) -> None:
        """The CLI's runner puts the coroutine on the loop the setting names (auto: uvloop)."""
        if not UVLOOP:
            unavailable("uvloop is not installed")
        assert run_async(_loop_module, event_loop=event_loop).split(".")[0] == module

    def test_an_unknown_loop_is_a_usage_error(self) -> None:
        """A loop name the runner does not know is one clear usage error naming the setting."""
        with pytest.raises(UsageError, match=r"\[triggerer\] event_loop = 'trio'"):
            run_async(_loop_module, event_loop="trio")
        with pytest.raises(EventLoopUnavailableError):
            uses_uvloop("trio")

    def test_asyncio_never_asks_for_uvloop(self) -> None:
        """``asyncio`` means the standard loop even where uvloop is installed."""
        assert uses_uvloop("asyncio") is False
        assert uses_uvloop("auto") is UVLOOP


class TestRuntimeTestsOnUvloop:
    async def test_the_loop_is_the_one_asked_for(self, anyio_backend: object) -> None:
        """A module with ALSO_ON_UVLOOP runs its async tests on both loops, for real."""
        wants_uvloop = isinstance(anyio_backend, tuple) and anyio_backend[1].get("use_uvloop")
        assert (await _loop_module()).startswith("uvloop") is bool(wants_uvloop)
