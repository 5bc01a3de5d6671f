"""The controls contract of the built-in backends: watcher pause/resume/retry rows, API tokens.

Runs against memory, SQLite and PostgreSQL through the ``backend`` fixture.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

import pytest
from watchkeeper.store import (
    BaseStateBackend,
    InvalidNameError,
    SqliteStateBackend,
    TokenExistsError,
)
from watchkeeper.store.protocols import (
    ApiToken,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _at(moment: datetime) -> datetime:
    return moment


def _token(name: str, token_id: str, *scopes: str) -> ApiToken:
    return ApiToken(name, token_id, scopes, "salt", "digest-" + token_id, T0, T0 + timedelta(1))


class TestWatcherControls:
    async def test_builtin_backends_support_controls(self, backend: BaseStateBackend) -> None:
        """Every built-in backend declares the controls capability."""
        assert backend.services.controls is not None

    async def test_pause_resume_keeps_one_row(self, backend: BaseStateBackend) -> None:
        """Pausing creates the row, resuming flips it, and the writer is recorded."""
        assert backend.services.controls is not None
        paused = await backend.controls.aset_watcher_paused("feed", True, by="cli:alice")
        assert (paused.watcher, paused.paused, paused.retry_seq) == ("feed", True, 0)
        resumed = await backend.controls.aset_watcher_paused("feed", False, by="api:ops")
        assert (resumed.paused, resumed.updated_by) == (False, "api:ops")
        rows = await backend.controls.alist_watcher_controls()
        assert [(r.watcher, r.paused) for r in rows] == [("feed", False)]

    async def test_retry_counts_up_and_keeps_paused(self, backend: BaseStateBackend) -> None:
        """Each retry adds one to retry_seq without touching the paused flag."""
        assert backend.services.controls is not None
        await backend.controls.aset_watcher_paused("b", True, by="cli:x")
        await backend.controls.arequest_watcher_retry("b", by="cli:x")
        row = await backend.controls.arequest_watcher_retry("b", by="cli:x")
        first = await backend.controls.arequest_watcher_retry("a", by="cli:x")
        assert (row.retry_seq, row.paused) == (2, True)
        assert first.retry_seq == 1
        assert [r.watcher for r in await backend.controls.alist_watcher_controls()] == ["a", "b"]

    async def test_bad_watcher_name_writes_nothing(self, backend: BaseStateBackend) -> None:
        """An empty watcher name is refused and no row appears."""
        assert backend.services.controls is not None
        with pytest.raises(InvalidNameError, match="watcher name"):
            await backend.controls.aset_watcher_paused("", True, by="cli:x")
        assert await backend.controls.alist_watcher_controls() == []


class TestApiTokens:
    async def test_create_get_list_revoke(self, backend: BaseStateBackend) -> None:
        """A token is found by its id, listed by name, and revoked once."""
        assert backend.services.controls is not None
        await backend.controls.acreate_token(_token("ops", "id1", "read", "write:asset:orders_*"))
        found = await backend.controls.aget_token("id1")
        assert found is not None
        assert (found.name, found.scopes, found.digest) == (
            "ops",
            ("read", "write:asset:orders_*"),
            "digest-id1",
        )
        assert found.expires_at == T0 + timedelta(1)
        assert await backend.controls.aget_token("nope") is None
        assert await backend.controls.arevoke_token("ops") is True
        assert await backend.controls.arevoke_token("ops") is False
        (listed,) = await backend.controls.alist_tokens()
        assert listed.revoked_at is not None

    async def test_live_name_is_refused_revoked_name_is_reused(
        self, backend: BaseStateBackend
    ) -> None:
        """A second token under a live name fails; once revoked, the name takes a new token."""
        assert backend.services.controls is not None
        await backend.controls.acreate_token(_token("ops", "id1", "read"))
        with pytest.raises(TokenExistsError, match="'ops' already exists"):
            await backend.controls.acreate_token(_token("ops", "id2", "admin"))
        assert (await backend.controls.aget_token("id1")) is not None
        await backend.controls.arevoke_token("ops")
        await backend.controls.acreate_token(_token("ops", "id2", "admin"))
        renewed = await backend.controls.aget_token("id2")
        assert renewed is not None and renewed.revoked_at is None
        assert await backend.controls.aget_token("id1") is None

    def test_repr_hides_digest(self) -> None:
        """A token's repr shows its name and scopes, never the salt or digest."""
        text = repr(_token("ops", "id1", "read"))
        assert "digest" not in text and "salt" not in text and "ops" in text


class TestControlsPersist:
    async def test_sqlite_rows_survive_reopen(self, tmp_path: object) -> None:
        """A paused watcher and a token are still there after the SQLite file is reopened."""
        from pathlib import Path

        path = Path(str(tmp_path)) / "s.db"
        async with SqliteStateBackend(path) as first:
            await first.controls.aset_watcher_paused("feed", True, by="cli:x")
            await first.controls.acreate_token(_token("ops", "id1", "read"))
        async with SqliteStateBackend(path) as second:
            assert [r.paused for r in await second.controls.alist_watcher_controls()] == [True]
            assert await second.controls.aget_token("id1") is not None


class TestEventReads:
    async def test_last_event_id_and_event_json(self, backend: BaseStateBackend) -> None:
        """The latest event id (per asset too), and events as JSON text built by the backend,
        paged by id, with the payload as it was committed."""
        import json

        from watchkeeper.store import Asset
        from watchkeeper.store.protocols import EventCommit, encode_json

        assert backend.services.controls is not None
        assert await backend.events.alast_event_id() == 0
        await backend.events.aregister_assets([Asset("a"), Asset("b")])
        for n, asset in enumerate(["a", "b", "a"], start=1):
            payload = encode_json({"n": n, "x": [1.5, "é"]})
            await backend.events.acommit(EventCommit("w", (asset,), payload, dedup_key=f"k{n}"))
        ids = [e.id for e in await backend.events.alist_events()]
        assert await backend.events.alast_event_id() == ids[-1]
        assert await backend.events.alast_event_id("b") == ids[1]
        rows = await backend.events.alist_events(asset="a", since_id=0, limit=10, raw=True)
        assert [i for i, _ in rows] == [ids[0], ids[2]]
        first = json.loads(rows[0][1])
        assert first["payload"] == {"n": 1, "x": [1.5, "é"]}
        assert (first["id"], first["asset"], first["watcher"], first["dedup_key"]) == (
            ids[0],
            "a",
            "w",
            "k1",
        )
        assert first["created_at"].startswith("20")
        page = await backend.events.alist_events(since_id=ids[0], limit=1, raw=True)
        assert [i for i, _ in page] == [ids[1]]

    async def test_count_events_since(self, backend: BaseStateBackend) -> None:
        """Events per watcher at or after a time, each asset's event counted; older ones and
        silent watchers are left out; a naive datetime is refused."""
        from watchkeeper.store import Asset, StateStoreError
        from watchkeeper.store.protocols import EventCommit, encode_json

        assert backend.services.controls is not None
        await backend.events.aregister_assets([Asset("a"), Asset("b")])
        log = backend.events
        for at, watcher, assets in [
            (T0 - timedelta(minutes=10), "old", ("a",)),
            (T0 - timedelta(minutes=10), "w", ("a",)),
            (T0, "w", ("a",)),
            (T0 + timedelta(seconds=30), "w", ("a", "b")),
            (T0 + timedelta(seconds=40), "v", ("b",)),
        ]:
            backend.clock = functools.partial(_at, at)
            await log.acommit(EventCommit(watcher, assets, encode_json(None)))
        assert await backend.events.acount_events_since(T0) == {"w": 3, "v": 1}
        assert await backend.events.acount_events_since(T0 + timedelta(hours=1)) == {}
        with pytest.raises(StateStoreError, match="since"):
            await backend.events.acount_events_since(datetime(2030, 1, 1))  # naive: no tzinfo


class TestDeleteIfVersion:
    async def test_deletes_only_at_the_expected_version(self, backend: BaseStateBackend) -> None:
        """A stale or missing version is a conflict naming the current one and deletes nothing;
        the current version deletes the key."""
        from watchkeeper.store import Asset, AssetNotFoundError, AssetScope, VersionConflictError

        assert backend.services.controls is not None
        await backend.events.aregister_assets([Asset("a")])
        scope = AssetScope(name="a")
        await backend.aset(scope, "k", 1)
        await backend.aset(scope, "k", 2)
        with pytest.raises(VersionConflictError) as stale:
            await backend.controls.adelete_if_version("a", "k", 1)
        assert (stale.value.expected, stale.value.actual) == (1, 2)
        assert await backend.aget(scope, "k") == 2
        await backend.controls.adelete_if_version("a", "k", 2)
        assert await backend.aget_entry(scope, "k") is None
        with pytest.raises(VersionConflictError) as missing:
            await backend.controls.adelete_if_version("a", "k", 2)
        assert missing.value.actual == 0
        with pytest.raises(AssetNotFoundError):
            await backend.controls.adelete_if_version("nope", "k", 1)


class TestArgumentChecks:
    async def test_bad_arguments_are_refused_alike_and_change_nothing(
        self, backend: BaseStateBackend
    ) -> None:
        """Each controls method refuses a wrong argument with the same error on every backend
        (checked once, in BaseStateBackend) and writes nothing."""
        from watchkeeper.store import ArgumentTypeError, InvalidArgumentError, InvalidKeyError

        assert backend.services.controls is not None
        with pytest.raises(ArgumentTypeError, match="paused must be a bool, got str"):
            await backend.controls.aset_watcher_paused("w", "yes", by="cli:x")  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match="by must be a str, got int"):
            await backend.controls.arequest_watcher_retry("w", by=7)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match="token must be an ApiToken, got dict"):
            await backend.controls.acreate_token({"name": "t"})  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match="token_id must be a str, got NoneType"):
            await backend.controls.aget_token(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="expected_version"):
            await backend.controls.adelete_if_version("a", "k", -1)
        with pytest.raises(InvalidKeyError):
            await backend.controls.adelete_if_version("a", "", 1)
        with pytest.raises(InvalidArgumentError, match="limit"):
            await backend.events.alist_events(since_id=0, limit=-1, raw=True)
        with pytest.raises(ArgumentTypeError, match="raw"):
            await backend.events.alist_events(raw=1)  # type: ignore[call-overload]
        with pytest.raises(InvalidNameError, match="asset name"):
            await backend.events.alast_event_id("")
        assert await backend.controls.alist_watcher_controls() == []
        assert await backend.controls.alist_tokens() == []
