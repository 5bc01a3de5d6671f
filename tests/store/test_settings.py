"""StoreSettings (sources and their precedence) and open_state_backend (URLs, dotted paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from watchkeeper.store import (
    BackendImportError,
    BaseStateBackend,
    ConfigFileNotFoundError,
    InvalidConfigFileError,
    MemoryStateBackend,
    PostgresStateBackend,
    SqliteStateBackend,
    StateStoreError,
    StoreSettings,
    UnknownSettingError,
    WorkersSettings,
    open_state_backend,
)


class CustomBackend(MemoryStateBackend):
    """A user-defined backend, importable by its dotted path."""


class NotABackend:
    """Something importable that is not a state backend."""


pytestmark = pytest.mark.usefixtures("isolated")


def _write_toml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


class TestStoreSettingsSources:
    def test_defaults(self) -> None:
        """Without a file or environment every key has its documented default."""
        settings = StoreSettings()
        assert settings.database_url() == "sqlite:///watchkeeper.db"
        assert settings.state_store.backend is None
        assert settings.state_store.default_retention_days == 30
        assert settings.state_store.clear_on_success is False
        assert settings.state_store.state_cleanup_batch_size == 0
        assert settings.state_store.max_value_bytes == 65536
        assert settings.workers.state_backend is None
        assert settings.events.max_payload_bytes == 1048576
        assert settings.events.retention_days == 30
        assert settings.events.dedup_retention_days == 7

    def test_reads_watchkeeper_toml_in_the_working_directory(self, isolated: Path) -> None:
        """``./watchkeeper.toml`` is read when no file is named."""
        _write_toml(
            isolated / "watchkeeper.toml",
            '[database]\nurl = "sqlite:///from-file.db"\n[state_store]\nclear_on_success = true\n',
        )
        settings = StoreSettings.load()
        assert settings.database_url() == "sqlite:///from-file.db"
        assert settings.state_store.clear_on_success is True

    def test_environment_beats_toml(self, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """WATCHKEEPER__SECTION__KEY overrides the same key in the file, others stay."""
        _write_toml(
            isolated / "watchkeeper.toml",
            "[state_store]\nmax_value_bytes = 100\ndefault_retention_days = 7\n",
        )
        monkeypatch.setenv("WATCHKEEPER__STATE_STORE__MAX_VALUE_BYTES", "200")
        settings = StoreSettings.load()
        assert settings.state_store.max_value_bytes == 200
        assert settings.state_store.default_retention_days == 7

    def test_explicit_arguments_beat_environment_and_toml(
        self, isolated: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An explicit argument wins over env and file; the sources merge key by key."""
        config = _write_toml(
            isolated / "other.toml",
            '[database]\nurl = "sqlite:///file.db"\n'
            "[state_store]\nmax_value_bytes = 100\nstate_cleanup_batch_size = 9\n",
        )
        monkeypatch.setenv("WATCHKEEPER__STATE_STORE__MAX_VALUE_BYTES", "200")
        monkeypatch.setenv("WATCHKEEPER__DATABASE__URL", "sqlite:///env.db")
        settings = StoreSettings.load(config, database={"url": "sqlite:///explicit.db"})
        assert settings.database_url() == "sqlite:///explicit.db"
        assert settings.state_store.max_value_bytes == 200
        assert settings.state_store.state_cleanup_batch_size == 9
        assert type(settings) is StoreSettings

    def test_named_file_replaces_the_default_file(self, isolated: Path) -> None:
        """With a file named, ./watchkeeper.toml is not read at all."""
        _write_toml(isolated / "watchkeeper.toml", "[state_store]\nmax_value_bytes = 1\n")
        named = _write_toml(isolated / "named.toml", "[state_store]\nclear_on_success = true\n")
        settings = StoreSettings.load(named)
        assert settings.state_store.clear_on_success is True
        assert settings.state_store.max_value_bytes == 65536

    def test_missing_named_file_is_an_error(self, isolated: Path) -> None:
        """A config file that was named but does not exist is a FileNotFoundError naming it."""
        with pytest.raises(ConfigFileNotFoundError, match=r"nope\.toml") as caught:
            StoreSettings.load(isolated / "nope.toml")
        assert isinstance(caught.value, FileNotFoundError)
        assert isinstance(caught.value, StateStoreError)

    def test_file_that_is_not_toml_is_an_error_naming_it(self, isolated: Path) -> None:
        """Broken TOML, named or found in the working directory, is an error naming the file."""
        broken = _write_toml(isolated / "watchkeeper.toml", "[database\nurl = 1\n")
        with pytest.raises(InvalidConfigFileError, match=r"'watchkeeper\.toml' is not valid TOML"):
            StoreSettings.load()
        with pytest.raises(InvalidConfigFileError, match="line 1"):
            StoreSettings.load(broken)

    def test_invalid_value_names_the_key(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A value out of range is a ValidationError located at section.key."""
        monkeypatch.setenv("WATCHKEEPER__STATE_STORE__DEFAULT_RETENTION_DAYS", "-1")
        with pytest.raises(ValidationError) as caught:
            StoreSettings.load()
        locations = [error["loc"] for error in caught.value.errors()]
        assert locations == [("state_store", "default_retention_days")]

    def test_unknown_key_in_a_section_is_rejected(self, isolated: Path) -> None:
        """A misspelt key inside a known section is an error naming it, not silently ignored."""
        config = _write_toml(isolated / "typo.toml", '[database]\npasword = "hunter2"\n')
        with pytest.raises(UnknownSettingError) as caught:
            StoreSettings.load(config)
        assert str(caught.value) == (
            f"config file {str(config)!r}: unknown key 'pasword' in [database]"
        )
        config = _write_toml(isolated / "typo.toml", "[state_store]\nmax_value_byte = 10\n")
        with pytest.raises(UnknownSettingError, match="did you mean 'max_value_bytes'"):
            StoreSettings.load(config)

    def test_misspelt_section_in_the_file_is_an_error(self, isolated: Path) -> None:
        """``[databse]`` is refused with the closest known section, not run on the default."""
        _write_toml(
            isolated / "watchkeeper.toml", '[databse]\nurl = "postgresql://u:hunter2@db/wk"\n'
        )
        with pytest.raises(UnknownSettingError) as caught:
            StoreSettings.load()
        assert str(caught.value) == (
            "config file 'watchkeeper.toml': unknown section [databse]; did you mean [database]?"
        )
        assert isinstance(caught.value, ValueError)

    @pytest.mark.parametrize(
        ("name", "tail"),
        [
            (
                "WATCHKEEPER__DATABSE__URL",
                "names no setting; did you mean WATCHKEEPER__DATABASE__URL?",
            ),
            (
                "WATCHKEEPER__STATE_STORE__MAX_VALUE_BYTE",
                "names no setting; did you mean WATCHKEEPER__STATE_STORE__MAX_VALUE_BYTES?",
            ),
            (
                "WATCHKEEPER_DATABASE_URL",
                "is not read (one underscore); did you mean WATCHKEEPER__DATABASE__URL?",
            ),
            ("WATCHKEEPER__NOTHING_LIKE_IT", "names no setting"),
        ],
    )
    def test_misspelt_environment_variable_is_an_error(
        self, monkeypatch: pytest.MonkeyPatch, name: str, tail: str
    ) -> None:
        """An unknown WATCHKEEPER__ variable, or one underscore for two, is an error naming it."""
        monkeypatch.setenv(name, "postgresql://u:hunter2@db/wk")
        with pytest.raises(UnknownSettingError) as caught:
            StoreSettings()
        assert str(caught.value) == f"environment variable {name} {tail}"

    def test_other_single_underscore_variables_are_left_alone(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A WATCHKEEPER_ variable that matches no setting (a test's, a script's) is not ours."""
        monkeypatch.setenv("WATCHKEEPER_TEST_PG_DSN", "postgresql://db/test")
        assert StoreSettings() == StoreSettings.model_construct()

    def test_misspelt_keyword_argument_is_an_error(self) -> None:
        """``StoreSettings(databse=...)`` names the argument and the closest section."""
        with pytest.raises(UnknownSettingError, match="'databse' in the arguments; did you mean"):
            StoreSettings.load(databse={"url": "sqlite:///x.db"})

    def test_validation_errors_never_show_the_value(self) -> None:
        """A bad value is named by its key; the value (maybe a password) is not in the error."""
        with pytest.raises(ValidationError) as caught:
            StoreSettings.load(database={"url": "postgresql://u:hunter2@db/wk", "pasword": "s3"})
        assert "database.pasword" in str(caught.value)
        assert "hunter2" not in str(caught.value) and "s3" not in str(caught.value)

    def test_a_section_added_to_the_model_is_known_at_once(self, isolated: Path) -> None:
        """The check reads the models: a subclass's new section and keys are accepted."""

        class Extended(StoreSettings):
            extra: WorkersSettings = WorkersSettings()

        config = _write_toml(isolated / "x.toml", "[extra]\nstate_backend = 'a.b.C'\n")
        assert Extended.load(config).extra.state_backend == "a.b.C"
        with pytest.raises(UnknownSettingError, match="config file"):
            StoreSettings.load(config)

    def test_sections_of_other_parts_are_ignored(self, isolated: Path) -> None:
        """The daemon's sections in a shared file do not stop the task side from reading it."""
        config = _write_toml(
            isolated / "shared.toml", "[triggerer]\ncapacity = 3\n[logging]\nlevel = 'debug'\n"
        )
        assert StoreSettings.load(config) == StoreSettings()

    def test_events_section_from_toml_and_environment(
        self, isolated: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``[events]`` is read from the file, and the environment overrides it key by key."""
        _write_toml(
            isolated / "watchkeeper.toml",
            "[events]\nmax_payload_bytes = 4096\nretention_days = 3\ndedup_retention_days = 9\n",
        )
        monkeypatch.setenv("WATCHKEEPER__EVENTS__RETENTION_DAYS", "0")
        events = StoreSettings().events
        assert (events.max_payload_bytes, events.retention_days) == (4096, 0)
        assert events.dedup_retention_days == 9

    @pytest.mark.parametrize(
        ("key", "value"),
        [("max_payload_bytes", 0), ("retention_days", -1), ("dedup_retention_days", -1)],
    )
    def test_bad_events_value_names_the_key(self, key: str, value: int) -> None:
        """A payload limit below 1 or a negative retention is refused, naming the key."""
        with pytest.raises(ValidationError, match=key):
            StoreSettings.load(events={key: value})

    def test_unknown_events_key_is_rejected(self) -> None:
        """A misspelled key of ``[events]`` is an error naming it."""
        with pytest.raises(ValidationError, match="retention_day"):
            StoreSettings.load(events={"retention_day": 1})

    def test_variables_of_other_parts_are_ignored(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The daemon's WATCHKEEPER__TRIGGERER__ variables do not stop the task side."""
        monkeypatch.setenv("WATCHKEEPER__TRIGGERER__CAPACITY", "3")
        monkeypatch.setenv("WATCHKEEPER__LOGGING__LEVEL", "debug")
        assert StoreSettings.load() == StoreSettings()

    def test_database_url_is_secret_in_repr(self) -> None:
        """A password in the URL does not appear in the settings' repr."""
        settings = StoreSettings.load(database={"url": "postgresql://u:hunter2@db/wk"})
        assert "hunter2" not in repr(settings)
        assert settings.database_url() == "postgresql://u:hunter2@db/wk"


class TestOpenStateBackendUrls:
    def _open(self, url: str, **state_store: object) -> BaseStateBackend:
        return open_state_backend(
            StoreSettings.load(database={"url": url}, state_store=state_store)
        )

    async def test_three_slashes_is_relative_to_the_working_directory(self, isolated: Path) -> None:
        """``sqlite:///rel/state.db`` opens ``rel/state.db`` under the working directory."""
        (isolated / "rel").mkdir()
        backend = self._open("sqlite:///rel/state.db")
        assert isinstance(backend, SqliteStateBackend)
        async with backend:
            pass
        assert (isolated / "rel" / "state.db").is_file()

    async def test_four_slashes_is_an_absolute_path(self, tmp_path: Path) -> None:
        """``sqlite:////abs/path.db`` opens that absolute path."""
        target = tmp_path / "abs" / "state.db"
        target.parent.mkdir()
        backend = self._open(f"sqlite:///{target}")
        async with backend:
            pass
        assert target.is_file()

    def test_memory_url_gives_a_memory_backend(self) -> None:
        """``sqlite:///:memory:`` and ``sqlite://`` keep state in process memory."""
        assert type(self._open("sqlite:///:memory:")) is MemoryStateBackend
        assert type(self._open("sqlite://")) is MemoryStateBackend

    @pytest.mark.parametrize(
        "url",
        [
            "postgresql://postgres@127.0.0.1:5432/test",
            "postgres://postgres@127.0.0.1:5432/test",
            "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
        ],
    )
    def test_postgres_schemes(self, url: str) -> None:
        """Each PostgreSQL spelling builds a PostgresStateBackend."""
        assert isinstance(self._open(url), PostgresStateBackend)

    def test_max_value_bytes_is_passed_on(self) -> None:
        """``[state_store] max_value_bytes`` reaches the backend."""
        assert self._open("sqlite:///:memory:", max_value_bytes=123).max_value_bytes == 123

    @pytest.mark.parametrize(
        "url", ["sqlite:///:memory:", "sqlite:///state.db", "postgresql://u@127.0.0.1/db"]
    )
    def test_max_payload_bytes_is_passed_on(self, url: str) -> None:
        """``[events] max_payload_bytes`` reaches every built-in backend."""
        settings = StoreSettings.load(database={"url": url}, events={"max_payload_bytes": 321})
        assert open_state_backend(settings).max_payload_bytes == 321

    def test_unknown_scheme_is_a_value_error_naming_it(self) -> None:
        """A scheme no backend handles is a ValueError that names the scheme."""
        with pytest.raises(ValueError, match="'mysql'"):
            self._open("mysql://root@db/wk")

    def test_text_without_scheme_is_a_value_error(self) -> None:
        """A bare path is not a URL; the error says what a URL looks like."""
        with pytest.raises(ValueError, match="not a URL"):
            self._open("watchkeeper.db")

    def test_sqlite_url_with_a_host_is_a_value_error(self) -> None:
        """``sqlite://host/x.db`` is a mistake for three or four slashes."""
        with pytest.raises(ValueError, match="names a host 'host'"):
            self._open("sqlite://host/x.db")

    @pytest.mark.parametrize(
        "url", ["sqlite://app:hunter2@host/x.db", "sqlite:///x.db?password=hunter2"]
    )
    def test_password_is_not_echoed_by_a_sqlite_url_error(self, url: str) -> None:
        """A sqlite URL refused for its host or query is quoted with the password masked."""
        with pytest.raises(ValueError, match=r"\*\*\*") as caught:
            self._open(url)
        assert "hunter2" not in str(caught.value)

    def test_password_is_not_echoed_by_the_not_a_url_error(self) -> None:
        """An error about the URL does not print a password it carries."""
        with pytest.raises(ValueError) as caught:
            self._open("user:hunter2@db")
        assert "hunter2" not in str(caught.value)


class TestOpenStateBackendDottedPath:
    def _settings(self, backend: str) -> StoreSettings:
        return StoreSettings.load(state_store={"backend": backend, "max_value_bytes": 77})

    def test_subclass_is_built_with_max_value_bytes(self) -> None:
        """A dotted path to a BaseStateBackend subclass wins over the URL."""
        backend = open_state_backend(self._settings(f"{__name__}.CustomBackend"))
        assert type(backend) is CustomBackend
        assert backend.max_value_bytes == 77

    def test_subclass_gets_max_payload_bytes(self) -> None:
        """A custom backend carries ``[events] max_payload_bytes`` like a built-in one."""
        settings = StoreSettings.load(
            state_store={"backend": f"{__name__}.CustomBackend"},
            events={"max_payload_bytes": 55},
        )
        assert open_state_backend(settings).max_payload_bytes == 55

    def test_colon_form_is_accepted(self) -> None:
        """``package.module:Class`` names the same class as ``package.module.Class``."""
        backend = open_state_backend(self._settings(f"{__name__}:CustomBackend"))
        assert type(backend) is CustomBackend

    def test_non_subclass_is_a_type_error_naming_the_path(self) -> None:
        """A class that is not a BaseStateBackend subclass is a TypeError naming the path."""
        path = f"{__name__}.NotABackend"
        with pytest.raises(TypeError, match=path.replace(".", r"\.")):
            open_state_backend(self._settings(path))

    def test_unimportable_module_is_an_import_error_naming_the_path(self) -> None:
        """A module that does not exist is a BackendImportError (an ImportError of the store's
        tree) naming the configured path and the module."""
        with pytest.raises(BackendImportError, match=r"no_such_module\.Backend") as caught:
            open_state_backend(self._settings("no_such_module.Backend"))
        assert isinstance(caught.value, ImportError) and isinstance(caught.value, StateStoreError)
        assert caught.value.name == "no_such_module"

    def test_missing_attribute_is_an_import_error(self) -> None:
        """A module without the named class is an ImportError naming both."""
        with pytest.raises(BackendImportError, match="has no attribute 'Missing'"):
            open_state_backend(self._settings(f"{__name__}.Missing"))

    def test_path_without_a_module_is_rejected_by_validation(self) -> None:
        """A bare class name is not a dotted path; validation says where it came from."""
        with pytest.raises(ValidationError, match=r"state_store\.backend"):
            self._settings("CustomBackend")
