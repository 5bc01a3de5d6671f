"""Reloads read again only what may have changed, in a reading process started ahead.

Each watcher file here notes, in the reading process only, that it was read (its name in a
file beside the watchers path), so a test sees which files a load read again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from watchkeeper.triggerer.daemon._evaluate import ReadingProcesses, aload_watchers
from watchkeeper.triggerer.daemon._loader import LoadResult
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers

from tests.triggerer.test_loader import TICKER, write


@pytest.fixture(autouse=True)
def _unload() -> Iterator[None]:
    yield
    unload_watchers()


@pytest.fixture
def watchers(tmp_path: Path) -> Path:
    directory = tmp_path / "watchers"
    directory.mkdir()
    write(directory, "ticks.py", TICKER)
    return directory


def noted_file(name: str, every: str = "1.0", imports: str = "") -> str:
    """A watcher file defining the asset ``name`` that notes each read of it in ``reads.log``."""
    return f"""
    import os, sys
    from pathlib import Path
    from watchkeeper.triggerer import Asset, AssetWatcher
    from ticks import Ticker
    {imports}
    if sys.argv[0] == "-c":  # the reading process, not the daemon rebuilding the trigger
        with open(Path(__file__).parent.parent / "reads.log", "a") as log:
            log.write(f"{name} {{os.getpid()}} {{os.getcwd()}} {{os.environ.get('WK_NOTE', '-')}}\\n")
    {name} = Asset("{name}", watchers=[AssetWatcher("{name}_feed", Ticker(every={every}))])
    """


def reads(watchers: Path) -> list[list[str]]:
    """The reads noted since the last call: ``[file, pid, cwd, WK_NOTE]`` each, in order."""
    log = watchers.parent / "reads.log"
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    log.unlink()
    return [line.split(" ") for line in lines]


def read_names(watchers: Path) -> list[str]:
    return sorted(r[0] for r in reads(watchers))


def everies(result: LoadResult) -> dict[str, float]:
    return {g.watchers[0]: g.kwargs["every"] for g in result.groups}


_before_the_test: set[int] = set()
"""The processes this one had started before the test (a session's servers: moto, Tansu)."""


@pytest.fixture(autouse=True)
def _not_the_tests() -> Iterator[None]:
    _before_the_test.update(_all_children())
    yield
    _before_the_test.clear()


def children() -> set[int]:
    """The processes this test started that are still there."""
    return _all_children() - _before_the_test


def _all_children() -> set[int]:
    """The processes this one started that are still there."""
    me = str(os.getpid())
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


class TestOnlyWhatChanged:
    async def test_a_reload_reads_again_only_the_file_that_changed(self, watchers: Path) -> None:
        """Of three files, the one rewritten is read again and its trigger rebuilt; the other
        two keep what was read and their trigger instances."""
        for name in ("a", "b", "c"):
            write(watchers, f"{name}.py", noted_file(name))
        first = await aload_watchers(watchers)
        assert read_names(watchers) == ["a", "b", "c"]
        write(watchers, "b.py", noted_file("b", every="2.0"))
        second = await aload_watchers(watchers, previous=first)
        assert read_names(watchers) == ["b"]
        assert everies(second) == {"a_feed": 1.0, "b_feed": 2.0, "c_feed": 1.0}
        before = {g.watchers: g.trigger for g in first.groups}
        kept = {g.watchers: g.trigger is before.get(g.watchers) for g in second.groups}
        assert kept == {("a_feed",): True, ("b_feed",): False, ("c_feed",): True}
        third = await aload_watchers(watchers, previous=second)  # nothing changed
        assert read_names(watchers) == []
        assert [g.trigger for g in third.groups] == [g.trigger for g in second.groups]

    async def test_a_change_to_an_imported_file_reads_again_every_file_importing_it(
        self, watchers: Path
    ) -> None:
        """``settings.py`` is imported by ``mid.py``, which ``a.py`` imports with an import
        statement and ``d.py`` with ``importlib.import_module`` after ``a.py`` imported it:
        changing ``settings.py`` reads both again; ``c.py``, which imports neither, is not."""
        write(watchers, "settings.py", "EVERY = 1.0\n")
        write(watchers, "mid.py", "import settings\n\nevery = settings.EVERY\n")
        write(watchers, "a.py", noted_file("a", every="every", imports="from mid import every"))
        write(watchers, "c.py", noted_file("c"))
        write(
            watchers,
            "d.py",
            noted_file("d", every="every", imports="import importlib\n"
                       "    every = importlib.import_module('mid').every"),
        )  # fmt: skip
        first = await aload_watchers(watchers)
        assert read_names(watchers) == ["a", "c", "d"]
        write(watchers, "settings.py", "EVERY = 3.0\n")
        second = await aload_watchers(watchers, previous=first)
        assert read_names(watchers) == ["a", "d"]
        assert everies(second) == {"a_feed": 3.0, "c_feed": 1.0, "d_feed": 3.0}

    async def test_a_removed_file_refuses_the_files_importing_it(self, watchers: Path) -> None:
        """``settings.py`` removed: ``a.py`` is read again, refused, and keeps its last good
        definitions; ``c.py`` is not read again."""
        write(watchers, "settings.py", "EVERY = 1.0\n")
        write(watchers, "a.py", noted_file("a", imports="import settings"))
        write(watchers, "c.py", noted_file("c"))
        first = await aload_watchers(watchers)
        reads(watchers)
        (watchers / "settings.py").unlink()
        second = await aload_watchers(watchers, previous=first)
        assert read_names(watchers) == []  # a.py failed before it noted its read
        assert [(e.file, e.reason.split(":")[0]) for e in second.errors] == [
            ("a.py", "import failed")
        ]
        assert "settings" in second.errors[0].reason
        assert everies(second) == {"a_feed": 1.0, "c_feed": 1.0}

    async def test_a_file_refused_last_time_is_read_again_though_unchanged(
        self, watchers: Path
    ) -> None:
        """``a.py`` imports a module that is not there yet: once it is, the next load reads
        ``a.py`` again (it did not change) and loads it."""
        write(watchers, "a.py", noted_file("a", imports="import later"))
        write(watchers, "c.py", noted_file("c"))
        first = await aload_watchers(watchers)
        assert [e.file for e in first.errors] == ["a.py"]
        assert read_names(watchers) == ["c"]
        write(watchers, "later.py", "")
        second = await aload_watchers(watchers, previous=first)
        assert read_names(watchers) == ["a"]
        assert second.errors == ()
        assert everies(second) == {"a_feed": 1.0, "c_feed": 1.0}

    async def test_another_allow_list_reads_and_rebuilds_everything(self, watchers: Path) -> None:
        """A load with another allow-list than the previous one's keeps nothing."""
        write(watchers, "a.py", noted_file("a"))
        first = await aload_watchers(watchers, allowed_modules=["ticks"])
        reads(watchers)
        second = await aload_watchers(watchers, allowed_modules=["other"], previous=first)
        assert read_names(watchers) == ["a"]
        assert second.groups == ()
        assert "outside allowed_trigger_modules" in second.errors[0].reason


class TestProcessStartedAhead:
    async def test_the_next_load_is_read_by_the_process_started_ahead(
        self, watchers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """After a load, one reading process waits; the next load is read by it, with the
        environment and working directory of that moment (not of its start). Leaving the
        ReadingProcesses ends it."""
        write(watchers, "a.py", noted_file("a"))
        async with ReadingProcesses() as processes:
            first = await aload_watchers(watchers, processes=processes)
            ((_, first_pid, _, _),) = reads(watchers)
            (waiting,) = children()
            assert waiting != int(first_pid)
            monkeypatch.setenv("WK_NOTE", "set-after-start")
            monkeypatch.chdir(tmp_path)
            write(watchers, "a.py", noted_file("a", every="2.0"))
            await aload_watchers(watchers, previous=first, processes=processes)
            assert reads(watchers) == [["a", str(waiting), str(tmp_path), "set-after-start"]]
            (after,) = children()
            assert after != waiting
        assert children() == set()

    async def test_a_process_started_ahead_that_died_is_replaced(self, watchers: Path) -> None:
        """The waiting process killed: the next load starts another and reads the files."""
        write(watchers, "a.py", noted_file("a"))
        async with ReadingProcesses() as processes:
            first = await aload_watchers(watchers, processes=processes)
            reads(watchers)
            (waiting,) = children()
            os.kill(waiting, signal.SIGKILL)
            with anyio.fail_after(10):
                while True:  # gone once reaped by the event loop's child watcher
                    if waiting not in children():
                        break
                    await anyio.sleep(0.01)
            write(watchers, "a.py", noted_file("a", every="2.0"))
            second = await aload_watchers(watchers, previous=first, processes=processes)
            ((_, pid, _, _),) = reads(watchers)
            assert int(pid) != waiting
            assert second.errors == ()
            assert everies(second) == {"a_feed": 2.0}
