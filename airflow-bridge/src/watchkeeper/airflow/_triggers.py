"""Apache Airflow's event triggers, run unchanged by ``watchkeeper triggerer``, exactly once.

A watcher file may define its assets the Airflow way: ``airflow.sdk.Asset`` with
``watchers=[AssetWatcher(name, trigger)]``, ``trigger`` a subclass of Airflow's
``BaseEventTrigger``. The daemon's loader reads those by their attributes and hands each
trigger to :data:`ADAPTER` (declared in the ``watchkeeper.trigger_adapters`` entry point
group), which wraps it into an :class:`AirflowTrigger`: one of ours, whose ``serialize()``
carries the Airflow trigger's own (its classpath, its kwargs with datetimes and timedeltas
tagged as JSON). The daemon rebuilds the Airflow trigger from that, as Airflow's triggerer
does (``import_string(classpath)(**kwargs)``), binds its ``asset_state_store`` and runs it.

What Airflow cannot do, this does: the state a trigger writes through ``asset_state_store``
between two yields is **held**, and committed in the same transaction as the next event it
yields (reads see the held writes). "Set the watermark, then yield" is then one commit: a
crash before it loses nothing, a crash after it repeats nothing. Writes that no yield follows
within ``linger`` seconds are committed on their own; ``delete`` and ``clear`` commit what is
held, then themselves, at once (an event's state can only upsert).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar, Final

import anyio
import anyio.lowlevel
from anyio import CancelScope
from watchkeeper.store import AssetStateStoreAccessor, AssetStateStoreAccessors
from watchkeeper.store.protocols import check_key, decode_value, encode_value
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent

__all__ = ["ADAPTER", "HOLD_LINGER", "AirflowAdapter", "AirflowTrigger"]

HOLD_LINGER: Final = 1.0
"""Seconds a held write waits for the event it goes with before it commits on its own."""

_BASE_MODULE: Final = "airflow.triggers.base"
_TAG: Final = "__watchkeeper_type__"
_TRIGGER_CLASS: Final = "watchkeeper.airflow.AirflowTrigger"


def _airflow_base(cls: type, name: str = "BaseEventTrigger") -> type | None:
    """Airflow's class ``name`` of ``airflow.triggers.base`` in ``cls``'s MRO (no import)."""
    for base in cls.__mro__:
        if base.__module__ == _BASE_MODULE and base.__qualname__ == name:
            return base
    return None


# -- kwargs: Airflow's may hold datetimes and timedeltas; ours are JSON --------------------------


def encode_kwargs(value: object, where: str = "kwargs") -> Any:
    """``value`` as JSON data: datetimes, dates, times, timedeltas and tuples tagged so that
    :func:`decode_kwargs` gives them back. Raises ``TypeError`` naming what cannot be kept."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; JSON has no NaN or infinity")
        return value
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "value": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "value": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "value": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {_TAG: "timedelta", "value": value.total_seconds()}
    if isinstance(value, list):
        return [encode_kwargs(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {
            _TAG: "tuple",
            "value": [encode_kwargs(v, f"{where}[{i}]") for i, v in enumerate(value)],
        }
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}; keys must be str")
            if key == _TAG:
                raise ValueError(f"{where} uses the reserved key {_TAG!r}")
            out[key] = encode_kwargs(item, f"{where}[{key!r}]")
        return out
    raise TypeError(
        f"{where} is a {type(value).__name__}, which cannot be kept as JSON (a trigger's "
        "kwargs may hold JSON values, datetimes, dates, times, timedeltas and tuples)"
    )


def decode_kwargs(value: Any) -> Any:
    """The inverse of :func:`encode_kwargs`."""
    if isinstance(value, list):
        return [decode_kwargs(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(_TAG)
    if kind is None:
        return {k: decode_kwargs(v) for k, v in value.items()}
    raw = value["value"]
    if kind == "datetime":
        return dt.datetime.fromisoformat(raw)
    if kind == "date":
        return dt.date.fromisoformat(raw)
    if kind == "time":
        return dt.time.fromisoformat(raw)
    if kind == "timedelta":
        return dt.timedelta(seconds=raw)
    if kind == "tuple":
        return tuple(decode_kwargs(v) for v in raw)
    raise ValueError(f"unknown tagged value {kind!r} in a trigger's kwargs")


def build_airflow_trigger(classpath: str, kwargs: Mapping[str, Any]) -> Any:
    """``import_string(classpath)(**kwargs)``, checked to be an Airflow ``BaseEventTrigger``."""
    # Airflow is optional: imported when a trigger is built (re-exported without __all__).
    from airflow.sdk.module_loading import import_string  # type: ignore[attr-defined]

    cls = import_string(classpath)
    if not isinstance(cls, type) or _airflow_base(cls) is None:
        raise TypeError(f"{classpath} is not a subclass of Airflow's BaseEventTrigger")
    return cls(**decode_kwargs(dict(kwargs)))


# -- the adapter the daemon's loader finds --------------------------------------------------------


class AirflowAdapter:
    """The :class:`~watchkeeper.triggerer.daemon.TriggerAdapter` of Apache Airflow's triggers."""

    framework = "Apache Airflow"
    trigger_class = _TRIGGER_CLASS

    def __repr__(self) -> str:
        return f"<AirflowAdapter trigger_class={self.trigger_class!r}>"

    def owns(self, trigger: object) -> bool:
        return _airflow_base(type(trigger), "BaseTrigger") is not None

    def wrap(self, trigger: object) -> tuple[str, dict[str, Any]]:
        cls = type(trigger)
        name = f"{cls.__module__}.{cls.__qualname__}"
        base = _airflow_base(cls)
        if base is None:
            raise TypeError(
                f"{name} is an Airflow BaseTrigger but not a BaseEventTrigger: only event "
                "triggers can watch assets"
            )
        produce = "create_shared_stream_producer"
        if getattr(getattr(cls, produce), "__func__", None) is not getattr(
            getattr(base, produce), "__func__", None
        ):
            raise TypeError(
                f"{name} overrides create_shared_stream_producer (Airflow's ack mode, which "
                "acknowledges its source from Airflow's database): not supported here"
            )
        classpath, kwargs = trigger.serialize()  # type: ignore[attr-defined]
        encoded = encode_kwargs(kwargs, f"{name}.serialize() kwargs")
        again = build_airflow_trigger(classpath, encoded).serialize()
        if again[0] != classpath or encode_kwargs(again[1]) != encoded:
            raise ValueError(
                f"{name}: the trigger rebuilt from its serialize() serializes differently "
                f"({again[0]!r} with other kwargs): the daemon runs what serialize() rebuilds"
            )
        return _TRIGGER_CLASS, {"classpath": classpath, "kwargs": encoded}

    def wrapped_classpath(self, kwargs: Mapping[str, Any]) -> str:
        classpath = kwargs["classpath"]
        if not isinstance(classpath, str):
            raise TypeError(f"classpath must be a str, got {classpath!r}")
        return classpath

    def prepare(self) -> None:
        import airflow.sdk.module_loading
        import airflow.triggers.base  # noqa: F401


ADAPTER = AirflowAdapter()
"""The adapter the ``watchkeeper.trigger_adapters`` entry point names."""


# -- held writes ---------------------------------------------------------------------------------


class _Held:
    """The writes an Airflow trigger made since its last yield, per asset, not committed yet."""

    def __init__(self, accessors: AssetStateStoreAccessors, linger: float, holding: bool) -> None:
        self.accessors = accessors
        self.linger = linger
        self.holding = holding
        self.writes: dict[str, dict[str, Any]] = {a.name: {} for a in accessors.assets}
        self.written = anyio.Event()
        self.error: Exception | None = None

    def hold(self, asset: str, key: str, value: Any) -> None:
        check_key(key)
        # Validated now (a wrong value fails at the call, as it would be written), and a
        # copy kept: the caller may change its object before the event commits.
        self.writes[asset][key] = decode_value(encode_value(key, value, max_value_bytes=None))
        self.written.set()

    def read(self, asset: str, key: str) -> tuple[bool, Any]:
        held = self.writes[asset]
        if key in held:
            return True, decode_value(encode_value(key, held[key], max_value_bytes=None))
        return False, None

    def take(self) -> dict[str, Any] | None:
        """The held writes as the next event's ``state`` (and forget them)."""
        held = [dict(w) for w in self.writes.values()]
        if not any(held):
            return None
        if any(w != held[0] for w in held[1:]):
            names = ", ".join(repr(n) for n, w in self.writes.items() if w)
            raise ValueError(
                f"the trigger wrote different state to its watched assets ({names}) before a "
                "yield; an event commits one state to every asset it watches: write the same "
                "keys to each, or watch one asset per trigger"
            )
        for w in self.writes.values():
            w.clear()
        self.written = anyio.Event()
        return held[0]

    async def commit(self) -> None:
        """Commit what is held, on its own (each key of each asset; shielded: a write the
        caller was told is held must not be left half done)."""
        for asset, writes in self.writes.items():
            accessor = self.accessors[asset]
            for key, value in list(writes.items()):
                with anyio.CancelScope(shield=True):
                    await accessor.aset(key, value)
                if writes.get(key) is value:  # not written again meanwhile
                    del writes[key]
        if not any(self.writes.values()):
            self.written = anyio.Event()

    def commit_sync(self) -> None:
        for asset, writes in self.writes.items():
            accessor = self.accessors[asset]
            for key, value in list(writes.items()):
                accessor.set(key, value)
                del writes[key]
        self.written = anyio.Event()

    async def commit_after_linger(self, scope: CancelScope) -> None:
        """Commit held writes no yield took within ``linger`` seconds (runs until cancelled;
        a commit that fails is kept in :attr:`error` and cancels ``scope``)."""
        try:
            while True:
                await self.written.wait()
                await anyio.sleep(self.linger)
                await self.commit()
        except Exception as exc:  # noqa: BLE001 - raised by the run, outside the task group
            self.error = exc
            scope.cancel()


class _AssetState:
    """One watched asset's state as an Airflow trigger sees it: Airflow's accessor methods,
    with writes held (see :class:`_Held`)."""

    def __init__(self, held: _Held, accessor: AssetStateStoreAccessor) -> None:
        self._held = held
        self._accessor = accessor
        self._name = accessor.asset.name

    def __repr__(self) -> str:
        return f"<AssetStateStoreAccessor name={self._name!r} (writes held until the next event)>"

    def get(self, key: str, default: Any = None) -> Any:
        found, value = self._held.read(self._name, key)
        return value if found else self._accessor.get(key, default)

    async def aget(self, key: str, default: Any = None) -> Any:
        found, value = self._held.read(self._name, key)
        return value if found else await self._accessor.aget(key, default)

    def set(self, key: str, value: Any) -> None:
        if not self._held.holding:
            self._accessor.set(key, value)
            return
        self._held.hold(self._name, key, value)

    async def aset(self, key: str, value: Any) -> None:
        if not self._held.holding:
            await self._accessor.aset(key, value)
            return
        self._held.hold(self._name, key, value)
        await anyio.lowlevel.checkpoint()

    def delete(self, key: str) -> None:
        self._held.commit_sync()
        self._accessor.delete(key)

    async def adelete(self, key: str) -> None:
        await self._held.commit()
        await self._accessor.adelete(key)

    def clear(self) -> None:
        self._held.commit_sync()
        self._accessor.clear()

    async def aclear(self) -> None:
        await self._held.commit()
        await self._accessor.aclear()


class _AssetStates:
    """``self.asset_state_store`` of an Airflow trigger: subscript with an Airflow ``Asset``
    (or a name or URI reference, or the name), or call the methods directly with one asset."""

    def __init__(self, held: _Held) -> None:
        self._states = [_AssetState(held, held.accessors[a]) for a in held.accessors.assets]
        self._assets = held.accessors.assets

    def __repr__(self) -> str:
        names = ", ".join(f"name={a.name!r}" for a in self._assets)
        return f"<AssetStateStoreAccessors [{names}]>"

    def __getitem__(self, key: Any) -> _AssetState:
        name = key if isinstance(key, str) else getattr(key, "name", None)
        uri = getattr(key, "uri", None)
        for asset, state in zip(self._assets, self._states, strict=True):
            if (name is not None and asset.name == name) or (uri is not None and asset.uri == uri):
                return state
        raise KeyError(f"{key!r} is not an asset this trigger watches")

    def _only(self) -> _AssetState:
        if len(self._states) != 1:
            raise ValueError(
                f"the trigger watches {len(self._states)} assets; use "
                "self.asset_state_store[MY_ASSET] to say which"
            )
        return self._states[0]

    def get(self, key: str, default: Any = None) -> Any:
        return self._only().get(key, default)

    async def aget(self, key: str, default: Any = None) -> Any:
        return await self._only().aget(key, default)

    def set(self, key: str, value: Any) -> None:
        self._only().set(key, value)

    async def aset(self, key: str, value: Any) -> None:
        await self._only().aset(key, value)

    def delete(self, key: str) -> None:
        self._only().delete(key)

    async def adelete(self, key: str) -> None:
        await self._only().adelete(key)

    def clear(self) -> None:
        self._only().clear()

    async def aclear(self) -> None:
        await self._only().aclear()


# -- the trigger the daemon runs -----------------------------------------------------------------


class AirflowTrigger(BaseEventTrigger):
    """Runs an Apache Airflow ``BaseEventTrigger`` (rebuilt from ``classpath`` and ``kwargs``,
    its ``serialize()``) as a watchkeeper watcher, its state writes held until the next event.

    ``linger``: seconds a held write waits for an event before it commits on its own.
    ``hold=False`` commits each write at once, as Airflow's triggerer does (the watermark then
    commits apart from its event: a crash between the two loses or repeats it). Constructing one imports Airflow (about two seconds the first time): the daemon does it
    in a thread.
    """

    hold_linger: ClassVar[float] = HOLD_LINGER

    def __init__(
        self,
        classpath: str,
        kwargs: Mapping[str, Any],
        linger: float = HOLD_LINGER,
        hold: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(linger, int | float) or not linger > 0:
            raise ValueError(f"linger must be a positive number of seconds, got {linger!r}")
        self._classpath = classpath
        self._kwargs = dict(kwargs)
        self._linger = float(linger)
        self._hold = bool(hold)
        self.airflow_trigger = build_airflow_trigger(classpath, self._kwargs)

    @classmethod
    def classpath(cls) -> str:
        return _TRIGGER_CLASS

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {"classpath": self._classpath, "kwargs": self._kwargs}
        if self._linger != HOLD_LINGER:
            kwargs["linger"] = self._linger
        if not self._hold:
            kwargs["hold"] = False
        return _TRIGGER_CLASS, kwargs

    def __repr__(self) -> str:
        return f"<AirflowTrigger {self.airflow_trigger!r}>"

    def _events(self) -> AsyncIterator[Any]:
        """The Airflow trigger's events: ``run()``, or its own shared stream filtered when it
        declares one (each trigger reads its own stream here; none is shared)."""
        trigger = self.airflow_trigger
        if trigger.shared_stream_key() is None:
            return trigger.run()  # type: ignore[no-any-return]
        _, kwargs = trigger.serialize()
        stream = type(trigger).open_shared_stream(kwargs)
        return trigger.filter_shared_stream(stream)  # type: ignore[no-any-return]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        held = _Held(self.asset_state_store, self._linger, self._hold)
        trigger = self.airflow_trigger
        trigger.asset_state_store = _AssetStates(held)
        events = self._events()
        try:
            while True:
                failure: BaseException | None = None
                finished = False
                event: Any = None
                # The generator is resumed in this task (its sync store calls need this
                # task's portal); a sibling commits what it holds once it lingers too long.
                async with anyio.create_task_group() as group:
                    group.start_soon(held.commit_after_linger, group.cancel_scope)
                    try:
                        event = await events.__anext__()
                    except StopAsyncIteration:
                        finished = True
                    except Exception as exc:  # noqa: BLE001 - raised below, outside the group
                        failure = exc
                    group.cancel_scope.cancel()
                if held.error is not None:
                    raise held.error  # the store refused a held write: the run ends
                if failure is not None:
                    raise failure  # what it held goes with it: the event never came
                if finished:
                    await held.commit()  # run() returned: what it wrote stands on its own
                    return
                yield TriggerEvent(getattr(event, "payload", event), state=held.take())
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
            trigger.asset_state_store = None

    async def cleanup(self) -> None:
        await self.airflow_trigger.cleanup()
