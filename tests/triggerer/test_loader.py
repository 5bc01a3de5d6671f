"""The loader of watcher definitions: grouping, the allow-list, JSON kwargs, broken files."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs
from watchkeeper.triggerer import BaseEventTrigger, TriggerImportError
from watchkeeper.triggerer.daemon._evaluate import aload_watchers
from watchkeeper.triggerer.daemon._identity import (
    canonical_trigger_json,
    rebuild_trigger,
    trigger_id_for,
)
from watchkeeper.triggerer.daemon._loader import load_watchers
from watchkeeper.triggerer.daemon._watcher_files import MODULES, scan_watchers_path, unload_watchers

TICKER = """
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent


class Ticker(BaseEventTrigger):
    def __init__(self, every=1.0, extra=None):
        super().__init__()
        self.every = every
        self.extra = extra

    def serialize(self):
        kwargs = {"every": self.every}
        if self.extra is not None:
            kwargs["extra"] = self.extra
        return (self.classpath(), kwargs)

    async def run(self):
        yield TriggerEvent({"every": self.every})
"""


@pytest.fixture(autouse=True)
def _unload() -> Iterator[None]:
    """Each test imports its own watcher files; forget them afterwards."""
    yield
    unload_watchers()


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def asset_file(asset: str, watcher: str, every: object = 1.0, extra: str = "None") -> str:
    return f"""
    from watchkeeper.triggerer import Asset, AssetWatcher
    from ticks import Ticker

    {asset} = Asset("{asset}", watchers=[AssetWatcher("{watcher}", Ticker(every={every!r}, extra={extra}))])
    """


@pytest.fixture
def watchers(tmp_path: Path) -> Path:
    directory = tmp_path / "watchers"
    directory.mkdir()
    write(directory, "ticks.py", TICKER)
    return directory


class TestGrouping:
    def test_identical_triggers_on_two_assets_run_once(self, watchers: Path) -> None:
        """Two assets in two files with the same serialize() and watcher name form one group."""
        write(watchers, "a.py", asset_file("orders", "shared_feed"))
        write(watchers, "b.py", asset_file("payments", "shared_feed"))
        result = load_watchers(watchers)
        assert result.errors == ()
        assert [a.name for a in result.assets] == ["orders", "payments"]
        (group,) = result.groups
        assert [a.name for a in group.assets] == ["orders", "payments"]
        assert group.watchers == ("shared_feed",)
        assert group.files == ("a.py", "b.py")
        assert group.classpath == "ticks.Ticker"

    def test_identical_triggers_under_two_names_are_two_groups(self, watchers: Path) -> None:
        """The same serialize() under two watcher names runs twice, once per name."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        write(watchers, "b.py", asset_file("payments", "payments_feed"))
        result = load_watchers(watchers)
        assert result.errors == ()
        groups = sorted(result.groups, key=lambda g: g.watchers)
        assert [(g.watchers, [a.name for a in g.assets]) for g in groups] == [
            (("orders_feed",), ["orders"]),
            (("payments_feed",), ["payments"]),
        ]
        assert groups[0].kwargs == groups[1].kwargs
        assert groups[0].trigger is not groups[1].trigger
        assert len({g.trigger_id for g in groups}) == 2

    def test_different_kwargs_make_different_groups(self, watchers: Path) -> None:
        """Triggers whose kwargs differ are separate groups with separate ids."""
        write(watchers, "a.py", asset_file("orders", "orders_feed", every=1.0))
        write(watchers, "b.py", asset_file("payments", "payments_feed", every=2.0))
        result = load_watchers(watchers)
        assert len(result.groups) == 2
        assert len({g.trigger_id for g in result.groups}) == 2

    def test_trigger_id_is_stable_across_loads(self, watchers: Path) -> None:
        """Loading the same definitions twice yields the same trigger id."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        first = load_watchers(watchers).groups[0].trigger_id
        second = load_watchers(watchers).groups[0].trigger_id
        assert first == second
        assert len(first) == 16

    def test_canonical_json_ignores_kwargs_order(self) -> None:
        """The id hashes canonical JSON, so kwargs order does not matter."""
        one = canonical_trigger_json("m.C", {"a": 1, "b": [1, 2]})
        two = canonical_trigger_json("m.C", {"b": [1, 2], "a": 1})
        assert one == two
        assert trigger_id_for(one) == trigger_id_for(two)

    def test_running_trigger_is_rebuilt_from_serialize(self, watchers: Path) -> None:
        """The group's trigger is a new instance built from the kwargs, not the file's object."""
        write(watchers, "a.py", asset_file("orders", "orders_feed", every=3.5))
        result = load_watchers(watchers)
        (group,) = result.groups
        defined = sys.modules["watchkeeper_watchers.a"].orders.watchers[0].trigger
        assert group.trigger is not defined
        assert isinstance(group.trigger, BaseEventTrigger)
        assert group.trigger.serialize() == defined.serialize()
        assert dict(group.kwargs) == {"every": 3.5}

    def test_files_in_subdirectories_load(self, watchers: Path) -> None:
        """A file in a subdirectory is imported as a submodule and its asset is found."""
        write(watchers, "team/sales.py", asset_file("sales", "sales_feed"))
        result = load_watchers(watchers)
        assert result.errors == ()
        assert [a.name for a in result.assets] == ["sales"]

    def test_removed_file_takes_its_assets_away(self, watchers: Path) -> None:
        """After a file is deleted, the next load no longer defines its asset."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        removed = write(watchers, "b.py", asset_file("payments", "payments_feed", every=2.0))
        first = load_watchers(watchers)
        removed.unlink()
        second = load_watchers(watchers, previous=first)
        assert [a.name for a in second.assets] == ["orders"]
        assert len(second.groups) == 1


class TestRewrittenFiles:
    def test_a_file_rewritten_at_the_same_size_and_second_loads_its_new_code(
        self, watchers: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bytecode cache is trusted on the source's size and whole-second mtime; a watcher
        file (and a helper beside it) rewritten within that second at the same size must not
        load its old code."""
        import os

        monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as an installed daemon runs
        path = write(watchers, "a.py", asset_file("orders", "orders_feed", every=1.0))
        helper = write(watchers, "ticks.py", TICKER + "\nVERSION = 1\n")
        stamps = [(p, p.stat().st_mtime_ns) for p in (path, helper)]
        first = load_watchers(watchers)
        write(watchers, "a.py", asset_file("orders", "orders_feed", every=2.0))
        write(watchers, "ticks.py", TICKER + "\nVERSION = 2\n")
        for p, mtime in stamps:  # the same size, and the same modification time
            os.utime(p, ns=(mtime, mtime))
        second = load_watchers(watchers, previous=first)
        assert second.groups[0].trigger.serialize()[1]["every"] == 2.0
        assert sys.modules["ticks"].VERSION == 2


class TestRefusals:
    def test_class_outside_allowed_modules_is_refused(self, watchers: Path) -> None:
        """A trigger class outside allowed_trigger_modules is refused and logged, not run."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        with capture_logs() as logs:
            result = load_watchers(watchers, allowed_modules=["watchkeeper.watchers"])
        assert result.groups == ()
        (error,) = result.errors
        assert (error.file, error.watcher) == ("a.py", "orders_feed")
        assert "outside allowed_trigger_modules" in error.reason
        assert "ticks.Ticker" in error.reason
        refused = [e for e in logs if e["event"] == "watcher_refused"]
        assert refused[0]["file"] == "a.py"
        assert refused[0]["watcher"] == "orders_feed"
        # The asset itself is still defined (tasks may use it); only the trigger is refused.
        assert [a.name for a in result.assets] == ["orders"]

    def test_prefix_must_match_a_whole_module(self) -> None:
        """An allowed prefix 'tick' does not allow the module 'ticks'."""
        with pytest.raises(TriggerImportError, match="outside allowed_trigger_modules"):
            rebuild_trigger("ticks.Ticker", {}, ["tick"])

    def test_non_trigger_class_is_refused(self) -> None:
        """A classpath naming something that is not a BaseEventTrigger subclass is refused."""
        with pytest.raises(TriggerImportError, match="not a BaseEventTrigger subclass"):
            rebuild_trigger("collections.OrderedDict", {}, ["collections"])

    def test_missing_class_is_a_clear_error(self) -> None:
        """A classpath whose attribute does not exist names the classpath."""
        with pytest.raises(TriggerImportError, match=r"cannot import trigger class 'json\.Nope'"):
            rebuild_trigger("json.Nope", {}, ["json"])

    def test_broken_file_does_not_stop_the_others(self, watchers: Path) -> None:
        """A syntax error and an import-time exception are reported; other files still load."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        write(watchers, "broken.py", "def oops(:\n")
        write(watchers, "raises.py", "raise RuntimeError('no database here')\n")
        write(watchers, "exits.py", "import sys\nsys.exit(3)\n")
        result = load_watchers(watchers)
        assert [a.name for a in result.assets] == ["orders"]
        assert len(result.groups) == 1
        reasons = {e.file: e.reason for e in result.errors}
        assert reasons["broken.py"].startswith("SyntaxError")
        assert "RuntimeError: no database here" in reasons["raises.py"]
        assert "SystemExit" in reasons["exits.py"]
        assert all(e.watcher is None for e in result.errors)

    def test_a_refusal_names_the_line_of_the_error(self, watchers: Path) -> None:
        """The reason names the file and line where the error was raised: the file's own
        line, the line of a helper module under the watchers path it imports, a syntax
        error's line, and the line in a trigger class whose serialize() failed."""
        write(watchers, "helper.py", "def connect():\n    x = 1\n    raise OSError('no db')\n")
        write(watchers, "raises.py", "import os\n\nraise RuntimeError('no database here')\n")
        write(watchers, "deep.py", "from helper import connect\n\nconn = connect()\n")
        write(watchers, "sub/broken.py", "x = 1\ndef oops(:\n")
        write(
            watchers,
            "bad_serialize.py",
            textwrap.dedent(
                """
                from watchkeeper.triggerer import Asset, AssetWatcher
                from ticks import Ticker

                class Broken(Ticker):
                    def serialize(self):
                        raise ValueError("cannot serialize")

                orders = Asset("orders", watchers=[AssetWatcher("orders_feed", Broken())])
                """
            ),
        )
        reasons = {e.file: e.reason for e in load_watchers(watchers).errors}
        assert reasons["raises.py"].endswith("RuntimeError: no database here (at raises.py:3)")
        assert reasons["deep.py"].endswith("OSError: no db (at helper.py:3)")
        assert reasons["sub/broken.py"].startswith("SyntaxError: ")
        assert reasons["sub/broken.py"].endswith(" (at sub/broken.py:2)")
        assert reasons["bad_serialize.py"].endswith(
            "ValueError: cannot serialize (at bad_serialize.py:7)"
        )

    def test_invalid_module_file_name_is_refused(self, watchers: Path) -> None:
        """A file whose name is not a module name is reported, not imported."""
        write(watchers, "my-watchers.py", asset_file("orders", "orders_feed"))
        result = load_watchers(watchers)
        (error,) = result.errors
        assert error.file == "my-watchers.py"
        assert "not a valid Python module name" in error.reason

    @pytest.mark.parametrize(
        ("every", "extra", "reason"),
        [
            (1.0, "__import__('datetime').datetime(2024, 1, 1)", "not JSON"),
            (1.0, "(1, 2)", "not JSON"),
            (1.0, "{1: 'a'}", "not JSON"),
            (float("inf"), "None", "not JSON"),
        ],
    )
    def test_kwargs_must_be_json(
        self, watchers: Path, every: float, extra: str, reason: str
    ) -> None:
        """serialize() kwargs with datetimes, tuples, int keys or infinities are refused."""
        write(watchers, "good.py", asset_file("orders", "orders_feed"))
        every_src = "float('inf')" if every == float("inf") else repr(every)
        write(
            watchers,
            "bad.py",
            f"""
            from watchkeeper.triggerer import Asset, AssetWatcher
            from ticks import Ticker

            bad = Asset("bad", watchers=[AssetWatcher("bad_feed", Ticker(every={every_src}, extra={extra}))])
            """,
        )
        result = load_watchers(watchers)
        (error,) = result.errors
        assert (error.file, error.watcher) == ("bad.py", "bad_feed")
        assert reason in error.reason
        assert [g.assets[0].name for g in result.groups] == ["orders"]

    def test_constructor_rejecting_kwargs_is_refused(self, watchers: Path) -> None:
        """A trigger whose class cannot be rebuilt from its own kwargs is refused."""
        write(
            watchers,
            "odd.py",
            """
            from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent

            class Odd(BaseEventTrigger):
                def __init__(self):
                    super().__init__()

                def serialize(self):
                    return (self.classpath(), {"unknown": 1})

                async def run(self):
                    yield TriggerEvent(1)

            odd = Asset("odd", watchers=[AssetWatcher("odd_feed", Odd())])
            """,
        )
        result = load_watchers(watchers)
        (error,) = result.errors
        assert error.watcher == "odd_feed"
        assert "watchkeeper_watchers.odd.Odd(**kwargs) failed" in error.reason

    def test_missing_directory_is_reported(self, tmp_path: Path) -> None:
        """A watchers path that does not exist loads nothing and says so."""
        result = load_watchers(tmp_path / "nowhere")
        assert result.groups == ()
        assert "not a directory" in result.errors[0].reason


class TestLastGoodDefinitions:
    def test_file_broken_during_an_edit_keeps_its_watchers(self, watchers: Path) -> None:
        """A file that loaded before and now fails keeps its last good definitions."""
        orders = write(watchers, "a.py", asset_file("orders", "orders_feed"))
        first = load_watchers(watchers)
        orders.write_text("def oops(:\n")
        second = load_watchers(watchers, previous=first)
        assert [a.name for a in second.assets] == ["orders"]
        assert [g.key for g in second.groups] == [g.key for g in first.groups]
        assert second.groups[0].trigger is first.groups[0].trigger
        assert second.errors[0].reason.startswith("SyntaxError")

    def test_without_a_previous_load_a_broken_file_defines_nothing(self, watchers: Path) -> None:
        """On a first load, a broken file contributes no asset."""
        write(watchers, "a.py", "def oops(:\n")
        result = load_watchers(watchers)
        assert result.assets == ()


class TestScan:
    def test_scan_sees_new_changed_and_removed_files(self, watchers: Path) -> None:
        """The mtime scan changes when a file is added, rewritten or removed."""
        before = scan_watchers_path(watchers)
        added = write(watchers, "a.py", asset_file("orders", "orders_feed"))
        after_add = scan_watchers_path(watchers)
        assert set(after_add) - set(before) == {"a.py"}
        added.write_text(added.read_text() + "\n# edited, longer\n")
        assert scan_watchers_path(watchers)["a.py"] != after_add["a.py"]
        added.unlink()
        assert "a.py" not in scan_watchers_path(watchers)

    def test_scan_sees_a_rewrite_at_the_same_size_and_time(self, watchers: Path) -> None:
        """A second write within one timestamp tick, at the same size, still changes the scan."""
        import os

        path = write(watchers, "a.py", asset_file("orders", "orders_feed", every=1.0))
        mtime = path.stat().st_mtime_ns
        before = scan_watchers_path(watchers)["a.py"]
        write(watchers, "a.py", asset_file("orders", "orders_feed", every=2.0))
        os.utime(path, ns=(mtime, mtime))  # the same size, and the same modification time
        assert scan_watchers_path(watchers)["a.py"] != before


def named_asset_file(asset: str, watcher: str = "feed", uri: str | None = None) -> str:
    """A file whose asset, watcher and URI names are Python literals (any characters)."""
    return f"""
    from watchkeeper.triggerer import Asset, AssetWatcher
    from ticks import Ticker

    thing = Asset({asset!r}, uri={uri!r}, watchers=[AssetWatcher({watcher!r}, Ticker(every=9))])
    """


class TestNames:
    @pytest.mark.parametrize(
        ("asset", "watcher", "uri", "reason"),
        [
            ("bad\x00name", "feed", None, r"invalid asset name .*control character '\\x00'"),
            ("bad\udc80", "feed", None, "invalid asset name .*lone surrogate"),
            ("x" * 2000, "feed", None, "invalid asset name .*2000 bytes in UTF-8, over the limit"),
            ("fine", "feed\nline", None, r"invalid watcher name .*control character '\\n'"),
            (
                "fine",
                "feed",
                "s3://b/\x00",
                r"invalid (uri of asset 'fine'|asset URI 's3://b/\\x00')",
            ),
        ],
    )
    def test_a_bad_name_refuses_only_its_file(
        self, watchers: Path, asset: str, watcher: str, uri: str | None, reason: str
    ) -> None:
        """A NUL, a lone surrogate or an over-long name refuses its file, named with the
        reason, before anything reaches the store; the other files load."""
        write(watchers, "good.py", asset_file("orders", "orders_feed"))
        write(watchers, "bad.py", named_asset_file(asset, watcher, uri))
        with capture_logs() as logs:
            result = load_watchers(watchers)
        assert [a.name for a in result.assets] == ["orders"]
        assert [g.watchers for g in result.groups] == [("orders_feed",)]
        (error,) = result.errors
        assert (error.file, error.watcher) == ("bad.py", None)
        assert re.search(reason, error.reason), error.reason
        refused = [e for e in logs if e["event"] == "watcher_refused"]
        assert [(e["file"], e["reason"]) for e in refused] == [("bad.py", error.reason)]

    def test_a_file_edited_to_a_bad_name_keeps_its_last_good_definitions(
        self, watchers: Path
    ) -> None:
        """As with a syntax error, a file that loaded before keeps running what it defined."""
        edited = write(watchers, "a.py", named_asset_file("orders"))
        first = load_watchers(watchers)
        edited.write_text(textwrap.dedent(named_asset_file("orders\x00")))
        second = load_watchers(watchers, previous=first)
        assert [a.name for a in second.assets] == ["orders"]
        assert second.groups[0].trigger is first.groups[0].trigger
        assert "control character" in second.errors[0].reason


class TestOneAssetOneFile:
    def test_the_same_asset_in_two_files_refuses_the_later_one(self, watchers: Path) -> None:
        """A copy-pasted asset with another watcher is refused, naming both files; the first
        file's watcher alone serves the asset (nothing is merged into its stream)."""
        write(watchers, "a.py", asset_file("orders", "orders_feed", every=1.0))
        write(watchers, "b.py", asset_file("orders", "copied_feed", every=2.0))
        result = load_watchers(watchers)
        assert [g.watchers for g in result.groups] == [("orders_feed",)]
        assert [a.name for a in result.assets] == ["orders"]
        (error,) = result.errors
        assert (error.file, error.watcher) == ("b.py", None)
        assert "asset 'orders' is already defined in a.py" in error.reason

    def test_a_different_uri_is_a_conflict_too(self, watchers: Path) -> None:
        """The same name with another URI is refused like any other difference."""
        write(watchers, "a.py", named_asset_file("orders", uri="s3://one/orders"))
        write(watchers, "b.py", named_asset_file("orders", uri="s3://two/orders"))
        result = load_watchers(watchers)
        assert [a.uri for a in result.assets] == ["s3://one/orders"]
        assert [e.file for e in result.errors] == ["b.py"]

    def test_an_identical_definition_in_another_file_is_accepted(self, watchers: Path) -> None:
        """Importing the asset object into another file, or repeating it identically, is no
        conflict: one group, no refusal."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        write(watchers, "b.py", "from a import orders\n")
        write(watchers, "c.py", asset_file("orders", "orders_feed"))
        result = load_watchers(watchers)
        assert result.errors == ()
        assert [g.watchers for g in result.groups] == [("orders_feed",)]

    def test_the_file_that_held_the_asset_keeps_it(self, watchers: Path) -> None:
        """A copy added later is refused even when it sorts first: the asset stays with the
        file that defined it in the previous load."""
        write(watchers, "orders.py", asset_file("orders", "orders_feed", every=1.0))
        first = load_watchers(watchers)
        write(watchers, "a_copy.py", asset_file("orders", "copied_feed", every=2.0))
        second = load_watchers(watchers, previous=first)
        assert [g.key for g in second.groups] == [g.key for g in first.groups]
        (error,) = second.errors
        assert error.file == "a_copy.py"
        assert "already defined in orders.py" in error.reason


class TestIsolatedLoading:
    """The daemon's loader: files read in a child process, each within import_timeout."""

    async def test_hung_and_exiting_files_are_refused_and_the_others_load(
        self, watchers: Path
    ) -> None:
        """A file stuck in ``while True: pass`` or ``time.sleep`` at import is refused as
        timed out, one that calls ``os._exit`` as ending the process; the rest load."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        write(watchers, "busy.py", "while True:\n    pass\n")
        write(watchers, "sleepy.py", "import time\ntime.sleep(3600)\n")
        write(watchers, "exits.py", "import os\nos._exit(7)\n")
        write(watchers, "z.py", asset_file("payments", "payments_feed", every=2.0))
        with anyio.fail_after(60), capture_logs() as logs:
            result = await aload_watchers(watchers, import_timeout=1)
        assert [a.name for a in result.assets] == ["orders", "payments"]
        assert sorted(g.watchers for g in result.groups) == [("orders_feed",), ("payments_feed",)]
        reasons = {e.file: e.reason for e in result.errors}
        assert reasons == {
            "busy.py": "import timed out after 1 s",
            "sleepy.py": "import timed out after 1 s",
            "exits.py": "import ended the process that reads the watcher files (exit status 7)",
        }
        refused = {e["file"] for e in logs if e["event"] == "watcher_refused"}
        assert refused == set(reasons)

    async def test_it_loads_what_the_in_process_loader_loads(self, watchers: Path) -> None:
        """Same groups, assets and refusals as load_watchers, and a file's own output on
        stdout does not get in the way."""
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        write(watchers, "b.py", asset_file("payments", "payments_feed"))
        write(watchers, "loud.py", 'print("{not json")\n' + textwrap.dedent(named_asset_file("x")))
        write(watchers, "broken.py", "def oops(:\n")
        write(watchers, "copy.py", asset_file("orders", "copied_feed", every=3.0))
        in_process = load_watchers(watchers)
        unload_watchers()
        isolated = await aload_watchers(watchers, import_timeout=30)
        assert [g.key for g in isolated.groups] == [g.key for g in in_process.groups]
        assert isolated.assets == in_process.assets
        assert isolated.errors == in_process.errors
        # orders_feed and payments_feed serialize alike but are two watchers: two groups
        assert [type(g.trigger).__name__ for g in isolated.groups] == ["Ticker"] * 3

    async def test_a_trigger_module_that_hangs_only_in_the_daemon_is_refused(
        self, watchers: Path
    ) -> None:
        """A module that imports in the reading process but hangs when the daemon imports it
        to rebuild the trigger (until the test releases it): that trigger is refused as timed
        out in the daemon, the others load; a load while that import still hangs does not wait for it, and keeps
        the triggers that were running (a.py is rewritten in between, so that its trigger
        is rebuilt; one whose files did not change keeps its instance without an import)."""
        write(
            watchers,
            "flaky.py",
            """
            import sys, time
            from pathlib import Path
            from watchkeeper.triggerer import Asset, AssetWatcher
            from ticks import Ticker

            class Flaky(Ticker):
                pass

            if sys.argv[0] != "-c":  # not the reading process: the daemon, held till released
                released = Path(__file__).parent.parent / "released"
                for _ in range(6000):
                    if released.exists():
                        break
                    time.sleep(0.01)
            flaky = Asset("flaky", watchers=[AssetWatcher("flaky_feed", Flaky(every=5))])
            """,
        )
        write(watchers, "a.py", asset_file("orders", "orders_feed"))
        with anyio.fail_after(60):
            result = await aload_watchers(watchers, import_timeout=0.5)
            write(watchers, "a.py", asset_file("orders", "orders_feed") + "    # rewritten\n")
            again = await aload_watchers(watchers, import_timeout=0.5, previous=result)
            # Let the abandoned import finish before the next test loads anything.
            (watchers.parent / "released").touch()
            assert await anyio.to_thread.run_sync(MODULES.lock.acquire, True, 40)
            MODULES.lock.release()
        errors = {(e.file, e.watcher): e.reason for e in result.errors}
        assert errors[("flaky.py", "flaky_feed")] == "import timed out after 0.5 s in the daemon"
        assert ("a.py", "orders_feed") not in errors
        assert [a.name for a in result.assets] == ["flaky", "orders"]
        stuck = "not rebuilt: an earlier import in the daemon still hangs"
        assert {(e.file, e.reason) for e in again.errors} == {
            ("flaky.py", stuck),
            ("a.py", f"{stuck}; the running trigger is kept"),
        }
        # The trigger that ran keeps its running instance; the one that never ran stays out.
        assert [(g.watchers, g.trigger) for g in again.groups] == [
            (g.watchers, g.trigger) for g in result.groups
        ]
