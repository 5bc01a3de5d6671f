"""``load_tasks``: the worker imports the definition files itself and keeps their tasks."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers
from watchkeeper.triggerer.worker._task_loader import load_tasks

TASK_FILE = textwrap.dedent(
    """
    from watchkeeper.triggerer import Asset, asset_task

    src = Asset("src")


    @asset_task(schedule=[src])
    def {name}(**context):
        pass
    """
)


@pytest.fixture
def defs(tmp_path: Path) -> Iterator[Path]:
    """An empty definitions folder; the imported modules are forgotten afterwards."""
    folder = tmp_path / "defs"
    folder.mkdir()
    yield folder
    unload_watchers()


class TestLoadTasks:
    def test_module_level_tasks_are_collected_by_name(self, defs: Path) -> None:
        """Every module-level asset_task of every file is found, sorted by name."""
        (defs / "a.py").write_text(TASK_FILE.format(name="zeta"))
        (defs / "b.py").write_text(TASK_FILE.format(name="alpha"))
        tasks, errors = load_tasks(defs)
        assert [t.name for t in tasks] == ["alpha", "zeta"]
        assert errors == ()

    def test_broken_file_and_duplicate_name_are_refused(self, defs: Path) -> None:
        """A file that does not import and a second task of one name are reported, not fatal."""
        (defs / "a.py").write_text(TASK_FILE.format(name="same"))
        (defs / "b.py").write_text(TASK_FILE.format(name="same"))
        (defs / "c.py").write_text("raise RuntimeError('boom')\n")
        tasks, errors = load_tasks(defs)
        assert [t.name for t in tasks] == ["same"]
        reasons = sorted(f"{e.file}: {e.reason}" for e in errors)
        assert reasons[0] == "b.py: task 'same' is already defined in a.py"
        assert "c.py: import failed: RuntimeError: boom" in reasons[1]

    def test_missing_folder_is_an_error(self, tmp_path: Path) -> None:
        """A path that is not a directory raises NotADirectoryError naming it."""
        with pytest.raises(NotADirectoryError, match="nope"):
            load_tasks(tmp_path / "nope")
