"""The ready-made watchers' parameters, declared once: every parameter survives ``serialize()``,
the serialized form is the one of earlier versions (a trigger's identity), positional and
keyword construction agree, and a bad value is refused by name without showing a secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from watchkeeper.triggerer import BaseEventTrigger
from watchkeeper.triggerer.testing import WatcherHarness
from watchkeeper.watchers import (
    DirectoryWatcher,
    HttpPollWatcher,
    KafkaWatcher,
    MqttWatcher,
    NatsJetStreamWatcher,
    PostgresChangesWatcher,
    RabbitMQWatcher,
    RedisStreamWatcher,
    SqlTableWatcher,
)
from watchkeeper.watchers._params import ReadyMadeWatcher


def next_cursor(body: Any, headers: Any) -> Any:
    """A cursor function at module level, so a watcher can name it by its import path."""
    return body.get("next") if isinstance(body, dict) else None


WATCHERS: list[type[ReadyMadeWatcher[Any]]] = [
    DirectoryWatcher,
    SqlTableWatcher,
    HttpPollWatcher,
    RedisStreamWatcher,
    NatsJetStreamWatcher,
    RabbitMQWatcher,
    MqttWatcher,
    KafkaWatcher,
    PostgresChangesWatcher,
]

EVERY: list[tuple[type[ReadyMadeWatcher[Any]], dict[str, Any]]] = [
    (
        DirectoryWatcher,
        {
            "path": "/data/in",
            "pattern": "*.csv",
            "poll_interval": 2.5,
            "lag_window": 30,
            "min_age": 1.5,
            "batch_size": 9,
        },
    ),
    (
        SqlTableWatcher,
        {
            "dsn": "postgresql://app@db:5432/main",
            "table": "public.events",
            "cursor_column": "seq",
            "key_column": "id",
            "batch_size": 7,
            "poll_interval": 3,
            "lag_window": 0,
            "columns": ["body", "at"],
            "timeout": 4.5,
        },
    ),
    (
        HttpPollWatcher,
        {
            "url": "https://api.example/feed",
            "items": "data.events",
            "item_key": "id",
            "cursor": "meta.next",
            "cursor_function": None,
            "cursor_param": "after",
            "headers": {"Accept-Language": "en"},
            "env_headers": {"Authorization": "EVENTS_TOKEN"},
            "poll_interval": 5,
            "timeout": 2.5,
            "backoff": 0.5,
            "max_backoff": 60,
            "retries": 3,
        },
    ),
    (
        HttpPollWatcher,
        {
            "url": "http://api.example/list",
            "items": "",
            "item_key": None,
            "cursor": None,
            "cursor_function": "tests.watchers.test_params:next_cursor",
            "cursor_param": "cursor",
            "headers": {},
            "env_headers": {},
            "poll_interval": 60.0,
            "timeout": 10.0,
            "backoff": 1.0,
            "max_backoff": 300.0,
            "retries": None,
        },
    ),
    (
        RedisStreamWatcher,
        {
            "stream": "orders",
            "url": "redis://127.0.0.1:6380/2",
            "start": "$",
            "batch_size": 10,
            "block": 1.5,
            "group": "g",
            "consumer": "c",
            "reconnect_attempts": 3,
        },
    ),
    (
        NatsJetStreamWatcher,
        {
            "stream": "ORDERS",
            "servers": ["nats://a:4222", "nats://b:4222"],
            "subject": "orders.>",
            "durable": "wk-orders",
            "batch_size": 10,
            "fetch_timeout": 1.5,
            "ack_wait": 12,
            "max_ack_pending": 50,
            "deliver": "new",
            "reconnect_attempts": 5,
            "connect_timeout": 3,
            "ping_interval": 4,
        },
    ),
    (
        RabbitMQWatcher,
        {
            "queue": "orders",
            "url": "amqps://u@mq:5671/vh",
            "prefetch": 5,
            "declare": True,
            "missing_id": "reject",
            "reconnect_attempts": 3,
            "heartbeat": 30,
        },
    ),
    (
        MqttWatcher,
        {
            "topics": ["a/#", "b/+"],
            "url": "mqtts://broker:8883",
            "client_id": "wk-1",
            "dedup_field": "meta.id",
            "dedup_property": "msg-id",
            "missing_id": "emit",
            "max_in_flight": 10,
            "session_expiry": 3600,
            "keepalive": 30,
            "connect_timeout": 5,
            "reconnect_max": 60,
        },
    ),
    (
        KafkaWatcher,
        {
            "topics": ["orders", "refunds"],
            "bootstrap_servers": ["k1:9092", "k2:9092"],
            "start": "latest",
            "batch_size": 50,
            "poll_timeout": 0.5,
            "group_id": "wk",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "me",
            "sasl_password": "pw",
            "request_timeout": 10,
            "reconnect_attempts": 3,
        },
    ),
    (
        PostgresChangesWatcher,
        {
            "dsn": "postgresql://cdc@db:5432/shop",
            "slot": "wk_orders",
            "publication": "wk_pub",
            "tables": ["orders", "public.refunds"],
            "batch_size": 50,
            "max_changes": 2000,
            "poll_interval": 0.5,
            "timeout": 10,
        },
    ),
]
"""Per watcher, arguments that together set every parameter to a value other than its default
(``HttpPollWatcher`` needs two: ``cursor`` and ``cursor_function`` exclude each other)."""

ADDED_LATER: list[tuple[type[ReadyMadeWatcher[Any]], dict[str, Any]]] = [
    (RedisStreamWatcher, {"stream": "s", "batch_linger": 0.02}),
    (NatsJetStreamWatcher, {"stream": "S", "batch_linger": 0.02}),
    (RabbitMQWatcher, {"queue": "q", "batch_size": 500, "batch_linger": 0.02}),
    (MqttWatcher, {"topics": ["t/#"], "batch_size": 1, "batch_linger": 0.02}),
]
"""Per watcher, the parameters added after it first shipped (its model's ``added_later``), off
their defaults: they are serialized then, and left out while at their defaults."""

REQUIRED: list[tuple[type[ReadyMadeWatcher[Any]], dict[str, Any]]] = [
    (DirectoryWatcher, {"path": "/data/in"}),
    (SqlTableWatcher, {"dsn": "sqlite:///x.db", "table": "t", "cursor_column": "c", "key_column": "k"}),
    (HttpPollWatcher, {"url": "https://api.example/feed"}),
    (RedisStreamWatcher, {"stream": "s"}),
    (NatsJetStreamWatcher, {"stream": "S"}),
    (RabbitMQWatcher, {"queue": "q"}),
    (MqttWatcher, {"topics": "t/#"}),
    (KafkaWatcher, {"topics": "t"}),
]  # fmt: skip
"""Per watcher, its required arguments only (every other parameter at its default)."""


def _canonical(classpath: str, kwargs: dict[str, Any]) -> str:
    """JSON text, keys sorted, as a trigger's identity is hashed from (``2`` is not ``2.0``)."""
    return json.dumps([classpath, kwargs], sort_keys=True, separators=(",", ":"))


def _ids(cases: list[tuple[type[Any], dict[str, Any]]]) -> list[str]:
    return [f"{cls.__name__}-{i}" for i, (cls, _) in enumerate(cases)]


class TestEveryParameterSurvivesSerialize:
    @pytest.mark.parametrize(("cls", "kwargs"), EVERY + ADDED_LATER, ids=_ids(EVERY + ADDED_LATER))
    def test_a_watcher_rebuilt_from_serialize_serializes_the_same(
        self, cls: type[ReadyMadeWatcher[Any]], kwargs: dict[str, Any]
    ) -> None:
        """serialize() returns every parameter as given, and rebuilds an equal watcher."""
        watcher = cls(**kwargs)
        classpath, serialized = watcher.serialize()
        assert classpath == f"{cls.__module__}.{cls.__qualname__}"
        later = cls.params_model.added_later
        dumped = watcher.params.model_dump(mode="json")
        assert serialized == {
            name: value for name, value in dumped.items() if name not in later or name in kwargs
        }
        assert {name: serialized[name] for name in kwargs} == kwargs
        assert list(serialized) == [
            name for name in cls.params_model.model_fields if name in serialized
        ]
        assert json.loads(json.dumps(serialized)) == serialized
        copy = WatcherHarness.rebuild(watcher)
        assert copy.serialize() == watcher.serialize()
        assert copy == watcher and hash(copy) == hash(watcher)

    @pytest.mark.parametrize("cls", WATCHERS, ids=[cls.__name__ for cls in WATCHERS])
    def test_the_cases_set_every_parameter_to_a_value_other_than_its_default(
        self, cls: type[ReadyMadeWatcher[Any]]
    ) -> None:
        """Each declared parameter is off its default in some case (a new one must be added)."""
        fields = cls.params_model.model_fields
        cases = [kwargs for case, kwargs in EVERY + ADDED_LATER if case is cls]
        unset = [
            name
            for name, info in fields.items()
            if not info.is_required()
            and all(
                kwargs.get(name, info.get_default(call_default_factory=True))
                == info.get_default(call_default_factory=True)
                for kwargs in cases
            )
        ]
        assert cases and unset == []

    @pytest.mark.parametrize(("cls", "kwargs"), EVERY, ids=_ids(EVERY))
    def test_positional_and_keyword_arguments_build_the_same_watcher(
        self, cls: type[ReadyMadeWatcher[Any]], kwargs: dict[str, Any]
    ) -> None:
        """The parameters also go by position, in their declared order, up to ``positional``."""
        # Parameters added later come last, so the ones a case sets are still a prefix.
        names = [name for name in cls.params_model.model_fields if name in kwargs]
        count = len(names) if cls.positional is None else min(cls.positional, len(names))
        args = [kwargs[name] for name in names[:count]]
        rest = {name: kwargs[name] for name in names[count:]}
        assert cls(*args, **rest).serialize() == cls(**kwargs).serialize()

    @pytest.mark.parametrize(("cls", "kwargs"), ADDED_LATER, ids=_ids(ADDED_LATER))
    def test_a_parameter_added_later_is_left_out_at_its_default(
        self, cls: type[ReadyMadeWatcher[Any]], kwargs: dict[str, Any]
    ) -> None:
        """A parameter named in ``added_later`` is serialized when set off its default and
        left out at its default, which keeps the identity earlier versions gave the trigger."""
        later = cls.params_model.added_later
        assert later and later <= kwargs.keys()
        required = {name: value for name, value in kwargs.items() if name not in later}
        assert later <= cls(**kwargs).serialize()[1].keys()
        assert not later & cls(**required).serialize()[1].keys()

    def test_a_cursor_given_as_a_function_serializes_as_its_import_path(self) -> None:
        """``cursor=<function>`` is kept as ``cursor_function``, which rebuilds the same."""
        watcher = HttpPollWatcher("https://api.example/list", items="", cursor=next_cursor)
        serialized = watcher.serialize()[1]
        assert serialized["cursor"] is None
        assert serialized["cursor_function"] == "tests.watchers.test_params:next_cursor"
        assert WatcherHarness.rebuild(watcher) == watcher

    def test_a_whole_number_stays_a_whole_number(self) -> None:
        """``poll_interval=2`` serializes as ``2``, not ``2.0``: what was given is what counts."""
        assert DirectoryWatcher("/d", poll_interval=2).serialize()[1]["poll_interval"] == 2
        assert (
            json.dumps(DirectoryWatcher("/d", poll_interval=2).serialize()[1]["poll_interval"])
            == "2"
        )

    def test_parameters_stay_readable_as_attributes(self) -> None:
        """``watcher.<parameter>`` reads the parameter, as in earlier versions."""
        watcher = SqlTableWatcher("postgresql://db/wk", "events", "seq", "id")
        assert watcher.params.timeout == 10.0
        assert watcher.timeout == 10.0  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            watcher.nope  # type: ignore[attr-defined]  # noqa: B018

    def test_the_asset_state_store_still_says_where_it_exists(self) -> None:
        """Outside ``run()``, ``asset_state_store`` raises its own error (a RuntimeError
        saying it exists only in ``run()``), not a plain missing attribute."""
        watcher = DirectoryWatcher("/d")
        with pytest.raises(RuntimeError, match="run"):
            watcher.asset_state_store  # noqa: B018
        assert not hasattr(watcher, "asset_state_store")


class TestSerializedFormIsStable:
    @pytest.mark.parametrize(
        ("cls", "kwargs", "index"),
        [(cls, kwargs, i) for i, (cls, kwargs) in enumerate(EVERY + REQUIRED)],
        ids=_ids(EVERY + REQUIRED),
    )
    def test_the_canonical_json_is_the_one_of_earlier_versions(
        self, cls: type[ReadyMadeWatcher[Any]], kwargs: dict[str, Any], index: int
    ) -> None:
        """Every case serializes to the canonical JSON earlier versions wrote, so the trigger
        ids of a running deployment stay the same."""
        assert _canonical(*cls(**kwargs).serialize()) == _canonical(*EARLIER[index])


EARLIER: list[list[Any]] = json.loads(
    (Path(__file__).parent / "serialized_earlier.json").read_text()
)
"""``[classpath, kwargs]`` of each case of ``EVERY + REQUIRED`` as earlier versions serialized
them (a trigger's identity is hashed from this JSON, sorted)."""


class TestBadParameters:
    @pytest.mark.parametrize(
        ("cls", "args", "kwargs", "error", "match"),
        [
            (DirectoryWatcher, ("/d", "*", 1.0, 1.0, 0.0, 5, "x"), {}, TypeError, "at most 6 positional"),
            (HttpPollWatcher, ("https://h/", "items"), {}, TypeError, "at most 1 positional"),
            (DirectoryWatcher, ("/d",), {"path": "/e"}, TypeError, "multiple values for argument 'path'"),
            (DirectoryWatcher, ("/d",), {"poll_intervall": 1}, TypeError, "poll_intervall is not a parameter"),
            (SqlTableWatcher, (), {"dsn": "sqlite:///x.db"}, TypeError, "table is required"),
            (RedisStreamWatcher, ("s",), {"block": "5"}, TypeError, "block must be a number, got str"),
            (RedisStreamWatcher, ("s",), {"block": True}, TypeError, "block must be a number, got bool"),
            (RedisStreamWatcher, ("s",), {"batch_size": 1.0}, TypeError, "batch_size must be an int"),
            (NatsJetStreamWatcher, ("S",), {"ping_interval": float("inf")}, ValueError, "ping_interval must be finite"),
            (NatsJetStreamWatcher, ("S",), {"servers": ["nats://h", 3]}, TypeError, "a server URL"),
            (NatsJetStreamWatcher, ("S",), {"servers": "http://h"}, ValueError, "server 'http://h' must start with nats://"),
            (NatsJetStreamWatcher, ("S",), {"deliver": "last"}, ValueError, "deliver must be 'all' or 'new', got 'last'"),
            (RabbitMQWatcher, ("q",), {"heartbeat": 0}, ValueError, "heartbeat must be at least 1, got 0"),
            (RabbitMQWatcher, ("q",), {"declare": 1}, TypeError, "declare must be a bool, got int"),
            (MqttWatcher, (), {"topics": ["a", ""]}, TypeError, "a topic filter must be a non-empty str"),
            (MqttWatcher, ("t",), {"max_in_flight": 65536}, ValueError, "max_in_flight must be at most 65535"),
            (MqttWatcher, ("t",), {"url": "mqtt://h:port"}, ValueError, "has a bad port"),
            (MqttWatcher, ("t",), {"session_expiry": -1}, ValueError, "session_expiry must be at least 1"),
            (HttpPollWatcher, ("https://h/",), {"backoff": -1}, ValueError, "backoff must be 0 or more"),
            (HttpPollWatcher, ("https://h/",), {"env_headers": {"A": 1}}, TypeError, "env_headers must be a mapping"),
            (HttpPollWatcher, ("https://h/",), {"cursor_param": ""}, ValueError, "cursor_param must not be empty"),
        ],
    )  # fmt: skip
    def test_a_bad_value_is_refused_naming_the_watcher_and_the_parameter(
        self,
        cls: type[BaseEventTrigger],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        error: type[Exception],
        match: str,
    ) -> None:
        """The error is a TypeError or ValueError starting with the watcher's name."""
        with pytest.raises(error, match=match) as caught:
            cls(*args, **kwargs)
        assert str(caught.value).startswith(cls.__name__)

    def test_every_bad_parameter_is_named_at_once(self) -> None:
        """Several bad values: one error naming each of them."""
        with pytest.raises(ValueError) as caught:
            DirectoryWatcher("/d", poll_interval=0, lag_window=-1, min_age=-2)
        message = str(caught.value)
        assert "poll_interval must be greater than 0" in message
        assert "lag_window must be 0 or more" in message
        assert "min_age must be 0 or more" in message

    @pytest.mark.parametrize(
        ("cls", "kwargs"),
        [
            (RedisStreamWatcher, {"stream": "s", "url": "http://u:hunter2@h/"}),
            (RedisStreamWatcher, {"stream": "s", "url": "redis://u:hunter2@h/", "block": 0}),
            (NatsJetStreamWatcher, {"stream": "S", "servers": ["ftp://u:hunter2@h"]}),
            (RabbitMQWatcher, {"queue": "q", "url": "amqp://u:hunter2@h/", "prefetch": "x"}),
            (MqttWatcher, {"topics": "t", "url": "tcp://u:hunter2@h"}),
            (SqlTableWatcher, {"dsn": "oracle://u:hunter2@h", "table": "t", "cursor_column": "c", "key_column": "k"}),
            (HttpPollWatcher, {"url": "ftp://u:hunter2@h/"}),
            (KafkaWatcher, {"topics": "t", "sasl_username": "u", "sasl_password": "hunter2"}),
            (KafkaWatcher, {"topics": "t", "security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "hunter2", "batch_size": 0}),
            (PostgresChangesWatcher, {"dsn": "mysql://u:hunter2@h/db", "slot": "s", "publication": "p"}),
            (PostgresChangesWatcher, {"dsn": "postgresql://u:hunter2@h/db", "slot": "s", "batch_size": 0}),
        ],
    )  # fmt: skip
    def test_an_error_never_shows_a_password(
        self, cls: type[BaseEventTrigger], kwargs: dict[str, Any]
    ) -> None:
        """A refused URL (or another parameter refused beside it) is shown without its secret."""
        with pytest.raises((TypeError, ValueError)) as caught:
            cls(**kwargs)
        assert "hunter2" not in str(caught.value)
        assert caught.value.__cause__ is None and caught.value.__context__ is None


class TestDocstrings:
    @pytest.mark.parametrize("cls", WATCHERS, ids=[cls.__name__ for cls in WATCHERS])
    def test_the_docstring_has_a_summary_every_parameter_and_what_it_raises(
        self, cls: type[ReadyMadeWatcher[Any]]
    ) -> None:
        """Summary line, then a ``:param:`` per declared parameter, then ``:raises:`` lines."""
        doc = cls.__doc__ or ""
        summary = doc.splitlines()[0]
        assert summary.endswith(".") and len(summary) <= 100
        params = [
            line.split(":")[1].removeprefix("param ")
            for line in doc.splitlines()
            if line.startswith(":param ")
        ]
        assert params == list(cls.params_model.model_fields)
        for name, info in cls.params_model.model_fields.items():
            assert info.description, f"{cls.__name__}.{name} has no docstring"
        assert ":raises TypeError:" in doc and ":raises ValueError:" in doc
        assert doc.index(":param ") < doc.index(":raises ")
