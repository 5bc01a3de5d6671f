"""``AirflowRelay``: committed watchkeeper events forwarded to Airflow's REST API, each once.

Each event of the chosen assets becomes one Airflow asset event (``POST /api/v2/assets/events``)
on the Airflow asset of the same name, with the event's payload and identity in ``extra``::

    {"watchkeeper": {"relay": "<name>", "event_id": 17, "asset": "orders",
                     "created_at": "..."}, "payload": {...}}

The relay reads the log through an :class:`~watchkeeper.store.EventConsumer` named after it:
its cursor lives in the store and moves after Airflow answered, in one transaction with the
record of that answer (Airflow's event id and timestamp, kept in the asset's state under
``airflow_relay/<name>``). Airflow takes no idempotency key, so a post whose answer was lost
(the relay killed, a timeout, a 5xx) is settled before anything is posted again: the relay lists
Airflow's events of that asset newer than the last answer it recorded and looks for its own
relay name and event id in their ``extra``. Found, the event is acknowledged without a second
post; not found, it is posted. With one relay per asset, each event reaches Airflow once.

Airflow is not imported: this speaks HTTP through httpx. Airflow's user needs the ``op`` role
(the simple auth manager's users) or a permission to create asset events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx
from watchkeeper.store import (
    AssetEvent,
    AssetScope,
    BaseStateBackend,
    EventConsumer,
)
from watchkeeper.store.protocols import check_name, get_logger, redact_secrets

__all__ = ["AirflowRelay", "RelayError", "RelaySettings", "relay_settings"]

log = get_logger(__name__)

STATE_PREFIX: Final = "airflow_relay/"
"""Asset state keys the relay writes: ``airflow_relay/<relay name>``."""

_LIST_PAGE: Final = 100


class RelayError(Exception):
    """The relay cannot go on without someone fixing something (credentials, roles, names)."""


class _Uncertain(Exception):
    """A post whose outcome is unknown (no answer, or a 5xx): settle it before posting again."""


@dataclass(frozen=True)
class RelaySettings:
    """Where and what to relay.

    ``airflow_url`` is the api-server's base URL (``http://airflow:8080``); ``assets`` the names
    of the watchkeeper assets to relay, each to the Airflow asset of the same name; ``name``
    names the relay's consumer and state (one relay per asset and name).
    """

    airflow_url: str
    username: str
    password: str = field(repr=False)
    assets: tuple[str, ...]
    name: str = "airflow"
    batch_size: int = 100
    idle_wait: float = 1.0
    retry_wait: float = 1.0
    request_timeout: float = 30.0

    def __post_init__(self) -> None:
        check_name(self.name, what="relay name")
        if not self.assets:
            raise ValueError("name at least one asset to relay")
        for asset in self.assets:
            check_name(asset, what="asset name")
        if not self.airflow_url.startswith(("http://", "https://")):
            raise ValueError(
                f"the Airflow URL {redact_secrets(self.airflow_url)!r} is not http(s)://..."
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")


class AirflowRelay:
    """Forward the committed events of ``settings.assets`` to Airflow, each exactly once.

    ``transport`` replaces the network (an ``httpx.ASGITransport`` over Airflow's app, say).
    Run it with :meth:`run` (forever) or :meth:`drain` (until nothing is left).
    """

    def __init__(
        self,
        store: BaseStateBackend,
        settings: RelaySettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.consumer = EventConsumer(
            store, f"airflow-relay:{settings.name}", assets=settings.assets
        )
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._token: str | None = None
        self._asset_ids: dict[str, int] = {}
        self._settled = False  # the first event after start is checked against Airflow's list
        self.posted = 0  # events posted by this object
        self.found = 0  # events found already in Airflow (a post whose answer was lost)

    @property
    def state_key(self) -> str:
        return STATE_PREFIX + self.settings.name

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Relay forever: new events as they commit, errors retried (a :class:`RelayError`,
        which needs someone to act, is raised)."""
        async with self._session():
            while True:
                try:
                    moved = await self._step()
                except _Uncertain as exc:
                    log.warning("airflow_relay_retry", relay=self.settings.name, error=str(exc))
                    await anyio.sleep(self.settings.retry_wait)
                    continue
                if not moved:
                    position = await self.consumer.position()
                    await self.store.events.await_events(position, self.settings.idle_wait)

    async def drain(self) -> int:
        """Relay until no event is left; return how many were acknowledged. Errors are raised."""
        done = 0
        async with self._session():
            while moved := await self._step():
                done += moved
        return done

    # -- one batch ------------------------------------------------------------------------------

    async def _step(self) -> int:
        events = await self.consumer.fetch(self.settings.batch_size)
        for event in events:
            await self._relay(event)
        return len(events)

    async def _relay(self, event: AssetEvent) -> None:
        scope = AssetScope(name=event.asset)
        last = await self.store.aget(scope, self.state_key)
        asset_id = await self._asset_id(event.asset)
        answer: Mapping[str, Any] | None = None
        if not self._settled:
            answer = await self._find(event, asset_id, last)
            if answer is not None:
                self.found += 1
                log.info("airflow_relay_found", relay=self.settings.name, event_id=event.id)
        if answer is None:
            self._settled = False  # until this post is answered, its outcome is unknown
            answer = await self._post(event, asset_id)
            self.posted += 1
        record = {
            "event_id": event.id,
            "airflow_event_id": answer.get("id"),
            "timestamp": answer.get("timestamp"),
        }
        await self.consumer.ack(event, state=[(scope, self.state_key, record)])
        self._settled = True

    # -- Airflow's API --------------------------------------------------------------------------

    def _extra(self, event: AssetEvent) -> dict[str, Any]:
        return {
            "watchkeeper": {
                "relay": self.settings.name,
                "event_id": event.id,
                "asset": event.asset,
                "created_at": event.to_record()["created_at"],
            },
            "payload": event.payload,
        }

    def _is_ours(self, extra: object, event: AssetEvent) -> bool:
        mark = extra.get("watchkeeper") if isinstance(extra, dict) else None
        return (
            isinstance(mark, dict)
            and mark.get("relay") == self.settings.name
            and mark.get("event_id") == event.id
        )

    async def _post(self, event: AssetEvent, asset_id: int) -> Mapping[str, Any]:
        body = {"asset_id": asset_id, "extra": self._extra(event)}
        answer = await self._request("POST", "/api/v2/assets/events", json=body)
        if not isinstance(answer, dict):
            raise _Uncertain("Airflow answered a post with something that is not an event")
        return answer

    async def _find(
        self, event: AssetEvent, asset_id: int, last: object
    ) -> Mapping[str, Any] | None:
        """Airflow's event carrying ``event``'s id, among those newer than the last answer."""
        params: dict[str, Any] = {
            "asset_id": asset_id,
            "order_by": "timestamp",
            "limit": _LIST_PAGE,
        }
        if isinstance(last, dict) and isinstance(last.get("timestamp"), str):
            params["timestamp_gt"] = last["timestamp"]
        offset = 0
        while True:
            page = await self._request(
                "GET", "/api/v2/assets/events", params={**params, "offset": offset}
            )
            events = page.get("asset_events", []) if isinstance(page, dict) else []
            for found in events:
                if isinstance(found, dict) and self._is_ours(found.get("extra"), event):
                    return found
            if len(events) < _LIST_PAGE:
                return None
            offset += len(events)

    async def _asset_id(self, name: str) -> int:
        if name in self._asset_ids:
            return self._asset_ids[name]
        page = await self._request(
            "GET", "/api/v2/assets", params={"name_pattern": name, "limit": _LIST_PAGE}
        )
        assets = page.get("assets", []) if isinstance(page, dict) else []
        matches = [a["id"] for a in assets if isinstance(a, dict) and a.get("name") == name]
        if len(matches) != 1:
            raise RelayError(
                f"Airflow has {'no' if not matches else 'several'} asset named {name!r}: "
                "declare it in a DAG (and let Airflow parse it) before relaying to it"
            )
        self._asset_ids[name] = int(matches[0])
        return self._asset_ids[name]

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self._client is not None
        for attempt in (1, 2):
            if self._token is None:
                self._token = await self._login()
            try:
                response = await self._client.request(
                    method, path, headers={"Authorization": f"Bearer {self._token}"}, **kwargs
                )
            except httpx.HTTPError as exc:
                raise _Uncertain(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            if response.status_code == 401 and attempt == 1:
                self._token = None  # expired: log in again once
                continue
            if response.status_code >= 500:
                raise _Uncertain(f"{method} {path}: Airflow answered {response.status_code}")
            if response.status_code >= 400:
                raise RelayError(
                    f"{method} {path}: Airflow answered {response.status_code}: {_detail(response)}"
                )
            return response.json()
        raise RelayError(f"{method} {path}: Airflow refused a fresh token (401)")

    async def _login(self) -> str:
        assert self._client is not None
        body = {"username": self.settings.username, "password": self.settings.password}
        try:
            response = await self._client.post("/auth/token", json=body)
        except httpx.HTTPError as exc:
            raise _Uncertain(f"POST /auth/token: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise _Uncertain(f"POST /auth/token: Airflow answered {response.status_code}")
        if response.status_code not in (200, 201):
            raise RelayError(
                f"Airflow refused user {self.settings.username!r} "
                f"({response.status_code}): check the user and the password"
            )
        token = response.json().get("access_token")
        if not isinstance(token, str):
            raise RelayError("Airflow's /auth/token answered without an access_token")
        return token

    def _session(self) -> _ClientSession:
        return _ClientSession(self)


class _ClientSession:
    """The relay's HTTP client for the length of a run."""

    def __init__(self, relay: AirflowRelay) -> None:
        self._relay = relay

    async def __aenter__(self) -> None:
        relay = self._relay
        relay._settled = False
        relay._client = httpx.AsyncClient(
            base_url=relay.settings.airflow_url.rstrip("/"),
            transport=relay._transport,
            timeout=relay.settings.request_timeout,
        )

    async def __aexit__(self, *exc_info: object) -> None:
        client, self._relay._client = self._relay._client, None
        if client is not None:
            with anyio.move_on_after(5, shield=True):
                await client.aclose()


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return redact_secrets(response.text[:300])
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return redact_secrets(str(detail)[:300])


def relay_settings(
    *,
    airflow_url: str,
    username: str,
    password: str,
    assets: Sequence[str],
    name: str = "airflow",
) -> RelaySettings:
    """:class:`RelaySettings` from plain values (the CLI's)."""
    return RelaySettings(
        airflow_url=airflow_url,
        username=username,
        password=password,
        assets=tuple(dict.fromkeys(assets)),
        name=name,
    )
