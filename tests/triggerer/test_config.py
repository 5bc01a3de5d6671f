"""Configuration that cannot silently go wrong.

Misspelt names are errors from every source and every entry point; ``config show`` tells where
each value came from; the runner and the daemon share one definition of each supervision
setting; and the README lists every key the models have.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from watchkeeper.store import MemoryStateBackend, UnknownSettingError
from watchkeeper.triggerer import RunnerConfig, Settings, TriggererSettings, load_settings
from watchkeeper.triggerer.cli import build_parser
from watchkeeper.triggerer.cli._runtime import with_triggerer_options
from watchkeeper.triggerer.daemon._daemon import Daemon, runner_config
from watchkeeper.triggerer.runtime._config import SupervisionSettings

README = Path(__file__).resolve().parents[2] / "README.md"

_SCRIPT = Path(sys.executable).with_name("watchkeeper")
COMMAND: list[str] = (
    [str(_SCRIPT)]
    if _SCRIPT.is_file()
    else [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]
)


pytestmark = pytest.mark.usefixtures("isolated")


def watchkeeper(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the ``watchkeeper`` command in ``cwd`` with only ``env`` as WATCHKEEPER variables."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("WATCHKEEPER")}
    clean["COLUMNS"] = "200"
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def sections(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The section models of a settings model, by section name."""
    found = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found[name] = annotation
    return found


class TestMisspeltNames:
    def test_the_daemon_settings_refuse_an_unknown_section(self, isolated: Path) -> None:
        """The daemon knows every section: one that is not a field is an error, with a hint."""
        config = isolated / "wk.toml"
        config.write_text("[triggerer]\ncapacty = 3\n[workerz]\nconcurrency = 2\n")
        with pytest.raises(UnknownSettingError) as caught:
            load_settings(config)
        assert caught.value.problems == [
            (
                f"config file {str(config)!r}: unknown key 'capacty' in [triggerer]; "
                "did you mean 'capacity'?"
            ),
            f"config file {str(config)!r}: unknown section [workerz]; did you mean [worker]?",
        ]

    def test_the_daemon_settings_refuse_an_unknown_variable(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """WATCHKEEPER__TRIGGERER__CAPACTY is an error naming the variable meant."""
        monkeypatch.setenv("WATCHKEEPER__TRIGGERER__CAPACTY", "3")
        with pytest.raises(UnknownSettingError, match="WATCHKEEPER__TRIGGERER__CAPACITY\\?"):
            load_settings()

    @pytest.mark.parametrize(
        ("setup", "named"),
        [
            ("file", "unknown section [databse]; did you mean [database]?"),
            ("env", "WATCHKEEPER__DATABSE__URL names no setting; did you mean"),
            ("single", "WATCHKEEPER_DATABASE_URL is not read (one underscore); did you mean"),
        ],
    )
    def test_the_daemon_stops_before_opening_a_database(
        self, isolated: Path, setup: str, named: str
    ) -> None:
        """A misspelt database setting exits 2 with one line; no watchkeeper.db appears."""
        (isolated / "watchers").mkdir()
        url = "postgresql://app:hunter2@db/wk"
        env: dict[str, str] = {}
        if setup == "file":
            (isolated / "watchkeeper.toml").write_text(f'[databse]\nurl = "{url}"\n')
        elif setup == "env":
            env["WATCHKEEPER__DATABSE__URL"] = url
        else:
            env["WATCHKEEPER_DATABASE_URL"] = url
        done = watchkeeper(isolated, "triggerer", env=env)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("watchkeeper: error: ") and named in line
        assert "hunter2" not in line
        assert not (isolated / "watchkeeper.db").exists()


class TestConfigShow:
    def test_json_names_each_value_and_its_source(self, isolated: Path) -> None:
        """Every key is listed once with its source (argument, env, file, default), masked."""
        (isolated / "watchkeeper.toml").write_text(
            '[database]\nurl = "postgresql://app:hunter2@db/wk"\n[triggerer]\ncapacity = 7\n'
        )
        done = watchkeeper(
            isolated,
            "--log-level",
            "debug",
            "config",
            "show",
            "--json",
            env={"WATCHKEEPER__TRIGGERER__LAG_THRESHOLD": "0"},
        )
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
        rows: dict[str, Any] = shown["settings"]
        assert shown["config_file"] == "watchkeeper.toml"
        assert rows["database.url"] == {"value": "postgresql://app:***@db/wk", "source": "file"}
        assert rows["triggerer.capacity"] == {"value": 7, "source": "file"}
        assert rows["triggerer.lag_threshold"] == {"value": 0.0, "source": "env"}
        assert rows["logging.level"] == {"value": "debug", "source": "argument"}
        assert rows["triggerer.backoff_jitter"] == {"value": 0.2, "source": "default"}
        expected = {
            f"{s}.{k}" for s, model in sections(Settings).items() for k in model.model_fields
        }
        assert set(rows) == expected
        assert "hunter2" not in done.stdout

    def test_table_for_people(self, isolated: Path) -> None:
        """Without --json, a table shows the same, password masked."""
        done = watchkeeper(
            isolated,
            "--database-url",
            "postgresql://app:hunter2@db/wk",
            "config",
            "show",
        )
        assert done.returncode == 0, done.stderr
        assert "hunter2" not in done.stdout
        [url_line] = [line for line in done.stdout.splitlines() if "database.url" in line]
        assert "postgresql://app:***@db/wk" in url_line and "argument" in url_line


# A value inside the bounds, and one outside them, for each supervision setting.
BOUNDS: list[tuple[str, object, object]] = [
    ("capacity", 1, 0),
    ("backoff_initial", 0.5, 0),
    ("backoff_max", 0.5, 0),
    ("backoff_jitter", 0.0, 1.0),
    ("max_failures", 0, -1),
    ("store_retry_max", 0.5, 0),
    ("cleanup_timeout", 0.5, 0),
    ("stop_grace", 0, -1),
    ("lag_threshold", 0, -0.1),
]


class TestOneDefinition:
    def test_bounds_cover_every_supervision_setting(self) -> None:
        """BOUNDS below exercises each field of the shared definition."""
        assert {name for name, _, _ in BOUNDS} == set(SupervisionSettings.model_fields)

    @pytest.mark.parametrize(("name", "good", "bad"), BOUNDS)
    @pytest.mark.parametrize("model", [RunnerConfig, TriggererSettings])
    def test_the_runner_and_the_daemon_have_the_same_bounds(
        self, model: type[BaseModel], name: str, good: object, bad: object
    ) -> None:
        """Each supervision setting accepts and refuses the same values in both models."""
        overrides: dict[str, Any] = {name: good}
        if name == "backoff_max":
            overrides["backoff_initial"] = 0.1
        assert getattr(model.model_validate(overrides), name) == good
        with pytest.raises(ValidationError, match=name):
            model.model_validate({name: bad})

    def test_every_supervision_setting_reaches_the_runner(self) -> None:
        """The daemon's runner gets each [triggerer] supervision key, none left at a default."""
        chosen = {
            "capacity": 3,
            "backoff_initial": 0.5,
            "backoff_max": 7.0,
            "backoff_jitter": 0.0,
            "max_failures": 0,
            "store_retry_max": 9.0,
            "cleanup_timeout": 1.5,
            "stop_grace": 2.5,
            "lag_threshold": 0,
        }
        assert set(chosen) == set(SupervisionSettings.model_fields)
        settings = load_settings(triggerer=chosen | {"heartbeat_interval": 4.0})
        config = runner_config(settings, owner="me")
        assert {name: getattr(config, name) for name in chosen} == chosen
        assert (config.status_interval, config.owner) == (4.0, "me")

    async def test_the_daemon_can_turn_the_lag_monitor_off(self, isolated: Path) -> None:
        """[triggerer] lag_threshold = 0 runs the daemon without a lag monitor."""
        (isolated / "watchers").mkdir()
        settings = load_settings(
            triggerer={
                "watchers_path": str(isolated / "watchers"),
                "lag_threshold": 0,
                "gc_interval": 0,
                "reload_interval": 60,
            }
        )
        async with MemoryStateBackend() as backend, Daemon(settings, backend=backend) as daemon:
            assert daemon.runner.lag_monitor is None
            assert daemon.reload_interval == 60

    def test_command_line_options_override_and_are_validated(self) -> None:
        """--reload-interval and --capacity replace the [triggerer] keys, checked the same way."""
        settings = load_settings(triggerer={"reload_interval": 9})
        args = argparse.Namespace(watchers_path=None, capacity=4, reload_interval=0.5)
        changed = with_triggerer_options(settings, args)
        assert (changed.triggerer.capacity, changed.triggerer.reload_interval) == (4, 0.5)
        assert settings.triggerer.reload_interval == 9


GUIDES = {
    "Configuration": README.parent / "docs" / "configuring.md",
    "The command line": README.parent / "docs" / "command-line.md",
}
"""The README's sections that moved to a page of the documentation (the page's title)."""


def _readme_section(title: str) -> str:
    """The section ``title`` of the README, or the page it moved to (its text to the end)."""
    page = GUIDES.get(title)
    if page is not None:
        text = page.read_text(encoding="utf-8")
        assert text.startswith(f"# {title}\n"), page
        return text
    text = README.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _readme_configuration() -> str:
    return _readme_section("Configuration").split("```toml\n", 1)[1].split("```", 1)[0]


class TestReadmeListing:
    def test_every_key_is_listed(self) -> None:
        """The README's configuration block has every section.key of Settings, and no other."""
        listed: set[str] = set()
        section = ""
        for line in _readme_configuration().splitlines():
            header = re.fullmatch(r"\[(\w+)\]", line.strip())
            key = re.match(r"#?\s*(\w+)\s*=", line.strip())
            if header:
                section = header[1]
            elif key:
                listed.add(f"{section}.{key[1]}")
        expected = {
            f"{s}.{k}" for s, model in sections(Settings).items() for k in model.model_fields
        }
        assert listed == expected

    def test_the_listing_is_the_defaults(self, isolated: Path) -> None:
        """The block loads as written and its values are the models' defaults."""
        config = isolated / "readme.toml"
        config.write_text(_readme_configuration(), encoding="utf-8")
        assert load_settings(config) == Settings.model_construct()

    def test_every_triggerer_option_is_listed(self) -> None:
        """Each option of ``watchkeeper triggerer`` appears in the command-line section."""
        parser = build_parser()
        [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        options = {
            option
            for action in commands.choices["triggerer"]._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        }
        text = _readme_section("The command line")
        assert options and {option for option in options if option not in text} == set()
