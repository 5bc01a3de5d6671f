"""``missing_database()``: whether opening a store would create its database empty, asked of
every backend the same way (a read-only command refuses to leave an empty file behind)."""

from __future__ import annotations

from pathlib import Path

from watchkeeper.store import BaseStateBackend, MemoryStateBackend, SqliteStateBackend


class TestMissingDatabase:
    async def test_an_sqlite_file_not_there_yet_is_named_until_opened(self, tmp_path: Path) -> None:
        """A SQLite path with no file is named; once opened (the file made) it is None, and
        asking created nothing."""
        path = tmp_path / "state.db"
        store = SqliteStateBackend(path)
        assert store.missing_database() == str(path)
        assert not path.exists()
        async with store:
            pass
        assert SqliteStateBackend(path).missing_database() is None

    def test_memory_has_no_database_to_miss(self) -> None:
        """The memory store keeps nothing on disk: None, opened or not."""
        assert MemoryStateBackend().missing_database() is None

    async def test_an_open_store_misses_nothing(self, backend: BaseStateBackend) -> None:
        """Every built-in backend, once open, says its database is there."""
        assert backend.missing_database() is None
