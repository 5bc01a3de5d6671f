"""``TaskFiles``: the worker's definition files followed, reading again only what changed
(in a child process first, then in the worker), a refused file keeping its tasks."""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchkeeper.triggerer.daemon import scan_watchers_path, unload_watchers
from watchkeeper.triggerer.worker import TaskFiles, TaskLoad

HEADER = """
import os
from watchkeeper.triggerer import Asset, asset_task

with open({log!r}, "a") as f:
    f.write(f"{name} {{os.getpid()}}\\n")
src = Asset("src")
"""
TASK = """

@asset_task(schedule=[src])
def {name}(**context):
    return {value}
"""


class Files:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log = folder.parent / "imports.log"
        self.files = TaskFiles(folder, import_timeout=30)

    def write(
        self, name: str, body: str = "", *, task: str | None = None, value: str = "1"
    ) -> None:
        text = HEADER.format(log=str(self.log), name=name) + textwrap.dedent(body)
        if task is not None:
            text += TASK.format(name=task, value=value)
        (self.folder / f"{name}.py").write_text(text)

    def imports(self, *, here: bool) -> Counter[str]:
        """How often each file was imported, in this process or in the reading children."""
        lines = self.log.read_text().split("\n") if self.log.exists() else []
        mine = str(os.getpid())
        return Counter(
            name for name, pid in (line.split() for line in lines if line) if (pid == mine) == here
        )

    async def reload(self) -> TaskLoad:
        return await self.files.reload(scan_watchers_path(self.files.path))


@pytest.fixture
def files(tmp_path: Path) -> Iterator[Files]:
    """Three files: ``a`` (task ``ta``), a helper ``h`` and ``c`` (task ``tc``, returning the
    helper's VERSION); the imported modules are forgotten afterwards."""
    folder = tmp_path / "defs"
    folder.mkdir()
    made = Files(folder)
    made.write("a", task="ta")
    made.write("h", "VERSION = 1\n")
    made.write("c", "import h\n", task="tc", value="h.VERSION")
    yield made
    unload_watchers()


class TestTaskFiles:
    async def test_only_what_changed_is_imported_again(self, files: Files) -> None:
        """A changed helper re-imports itself and the file importing it, not the others; the
        child reads every file once (the start noted no imports), then only what changed."""
        first = files.files.load()
        assert sorted(first.tasks) == ["ta", "tc"] and first.tasks["tc"].fn() == 1
        files.write("h", "VERSION = 2\n")
        second = await files.reload()
        assert second.tasks["tc"].fn() == 2
        assert second.tasks["ta"] is first.tasks["ta"]
        # h twice each time: as the file "h.py" and as the module "h" c imports
        assert files.imports(here=True) == Counter(a=1, c=2, h=4)
        assert files.imports(here=False) == Counter(a=1, c=1, h=2)

        files.write("a", task="ta", value="3")
        third = await files.reload()
        assert third.tasks["ta"].fn() == 3 and third.tasks["tc"] is second.tasks["tc"]
        assert files.imports(here=True) == Counter(a=2, c=2, h=4)
        assert files.imports(here=False) == Counter(a=2, c=1, h=2)

    async def test_a_refused_file_keeps_its_tasks_and_a_gone_one_loses_them(
        self, files: Files
    ) -> None:
        """A file that no longer imports is refused, naming it, and its task stays as it was
        (until the file is fixed); a removed file's task is gone."""
        first = files.files.load()
        files.write("c", "import h\nraise RuntimeError('half deployed')\n", task="tc")
        broken = await files.reload()
        (error,) = broken.errors
        assert error.file == "c.py" and "RuntimeError: half deployed" in error.reason
        assert broken.tasks["tc"] is first.tasks["tc"]
        (files.folder / "a.py").unlink()
        files.write("c", "import h\n", task="tc", value="5")
        fixed = await files.reload()
        assert sorted(fixed.tasks) == ["tc"] and fixed.errors == ()
        assert fixed.tasks["tc"].fn() == 5

    async def test_a_path_gone_for_a_moment_keeps_every_task(self, files: Files) -> None:
        """The definitions folder moved away (a deploy): refused, every task kept; back with
        a change, only that change applies."""
        first = files.files.load()
        away = files.folder.with_name("away")
        files.folder.rename(away)
        gone = await files.reload()
        assert gone.tasks == first.tasks and "not a directory" in gone.errors[0].reason
        away.rename(files.folder)
        files.write("a", task="ta", value="7")
        back = await files.reload()
        assert back.errors == () and back.tasks["ta"].fn() == 7
        assert back.tasks["tc"] is first.tasks["tc"]

    async def test_a_hanging_file_is_refused_without_blocking(self, files: Files) -> None:
        """A file that hangs at import is refused by the child after import_timeout; the
        worker never imports it and keeps the task it had."""
        files.files.import_timeout = 1
        first = files.files.load()
        files.write("a", "import time\ntime.sleep(60)\n", task="ta", value="2")
        hung = await files.reload()
        (error,) = hung.errors
        assert error.file == "a.py" and "timed out" in error.reason
        assert hung.tasks["ta"] is first.tasks["ta"]
        assert files.imports(here=True)["a"] == 1
