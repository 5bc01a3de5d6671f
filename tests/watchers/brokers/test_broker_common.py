"""What every broker watcher shares, checked without a server: extras, arguments, secrets."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from watchkeeper.triggerer import BaseEventTrigger
from watchkeeper.triggerer.testing import WatcherHarness
from watchkeeper.watchers import (
    MqttWatcher,
    NatsJetStreamWatcher,
    RabbitMQWatcher,
    RedisStreamWatcher,
)
from watchkeeper.watchers._broker import decode_body, make_dedup_key, redact_url
from watchkeeper.watchers.redis_stream import parse_id

WITH_PASSWORD: list[tuple[type[BaseEventTrigger], dict[str, Any], str]] = [
    (RedisStreamWatcher, {"stream": "s", "url": "redis://u:hunter2@h:6379/0"}, "hunter2"),
    (NatsJetStreamWatcher, {"stream": "S", "servers": "nats://u:hunter2@h:4222"}, "hunter2"),
    (NatsJetStreamWatcher, {"stream": "S", "servers": ["nats://tok3n@h:4222"]}, "tok3n"),
    (RabbitMQWatcher, {"queue": "q", "url": "amqp://u:hunter2@h:5672/"}, "hunter2"),
    (MqttWatcher, {"topics": "t/#", "url": "mqtt://u:hunter2@h:1883"}, "hunter2"),
]
IDS = ["redis", "nats", "nats-token", "rabbitmq", "mqtt"]


class TestBrokerWatcherArguments:
    @pytest.mark.parametrize(("cls", "kwargs", "secret"), WITH_PASSWORD, ids=IDS)
    def test_repr_hides_the_secret(
        self, cls: type[BaseEventTrigger], kwargs: dict[str, Any], secret: str
    ) -> None:
        """repr() shows the server with *** in place of the password or token."""
        text = repr(cls(**kwargs))
        assert secret not in text
        assert "***" in text

    @pytest.mark.parametrize(("cls", "kwargs", "secret"), WITH_PASSWORD, ids=IDS)
    def test_serialize_is_json_and_rebuilds_an_equal_watcher(
        self, cls: type[BaseEventTrigger], kwargs: dict[str, Any], secret: str
    ) -> None:
        """serialize() kwargs survive a JSON round trip and rebuild an equal watcher."""
        watcher = cls(**kwargs)
        classpath, serialized = watcher.serialize()
        assert json.loads(json.dumps(serialized)) == serialized
        assert classpath == f"{cls.__module__}.{cls.__qualname__}"
        assert WatcherHarness.rebuild(watcher) == watcher

    @pytest.mark.parametrize(
        ("cls", "kwargs", "error", "match"),
        [
            (RedisStreamWatcher, {"stream": ""}, ValueError, "stream must not be empty"),
            (RedisStreamWatcher, {"stream": "s", "url": "http://h"}, ValueError, "redis://"),
            (RedisStreamWatcher, {"stream": "s", "start": "x-1"}, ValueError, "not a Redis"),
            (RedisStreamWatcher, {"stream": "s", "batch_size": 0}, ValueError, "batch_size"),
            (RedisStreamWatcher, {"stream": "s", "consumer": "c"}, ValueError, "needs a group"),
            (NatsJetStreamWatcher, {"stream": "S", "servers": []}, TypeError, "servers"),
            (NatsJetStreamWatcher, {"stream": "S", "durable": "a.b"}, ValueError, "durable"),
            (NatsJetStreamWatcher, {"stream": "S", "deliver": "last"}, ValueError, "deliver"),
            (NatsJetStreamWatcher, {"stream": "S", "ack_wait": 0}, ValueError, "ack_wait"),
            (RabbitMQWatcher, {"queue": "q", "url": "redis://h"}, ValueError, "amqp://"),
            (RabbitMQWatcher, {"queue": "q", "missing_id": "drop"}, ValueError, "missing_id"),
            (RabbitMQWatcher, {"queue": "q", "declare": "yes"}, TypeError, "declare"),
            (MqttWatcher, {"topics": []}, TypeError, "topics"),
            (MqttWatcher, {"topics": "t", "url": "tcp://h"}, ValueError, "mqtt://"),
            (MqttWatcher, {"topics": "t", "missing_id": "reject"}, ValueError, "missing_id"),
            (MqttWatcher, {"topics": "t", "max_in_flight": 70000}, ValueError, "max_in_flight"),
        ],
    )
    def test_bad_arguments_are_refused_by_name(
        self,
        cls: type[BaseEventTrigger],
        kwargs: dict[str, Any],
        error: type[Exception],
        match: str,
    ) -> None:
        """A bad argument is a TypeError/ValueError naming the watcher and the argument."""
        with pytest.raises(error, match=match) as caught:
            cls(**kwargs)
        assert cls.__name__ in str(caught.value)

    def test_a_bad_url_is_reported_without_its_password(self) -> None:
        """The error for a URL of the wrong scheme does not repeat its password."""
        with pytest.raises(ValueError) as caught:
            RabbitMQWatcher("q", url="http://u:hunter2@h/")
        assert "hunter2" not in str(caught.value)


class TestBrokerHelpers:
    def test_ids_compare_as_integer_pairs(self) -> None:
        """Stream ids order by (ms, seq) as numbers; a malformed id is a ValueError."""
        assert parse_id("10-0") > parse_id("9-5") > parse_id("9-0")
        assert parse_id(b"1700000000000-12") == (1700000000000, 12)
        with pytest.raises(ValueError, match="not a Redis stream id"):
            parse_id("9")

    @pytest.mark.parametrize(
        ("data", "decoded"),
        [
            (b'{"a": [1, 2]}', {"a": [1, 2]}),
            (b"42", 42),
            (b"plain text", "plain text"),
            (b"NaN", "NaN"),
            (b"\xff\x00", {"base64": "/wA="}),
        ],
    )
    def test_a_body_becomes_json_text_or_base64(self, data: bytes, decoded: Any) -> None:
        """A body is its JSON value, else its text, else base64 (NaN is text, not a number)."""
        assert decode_body(data) == decoded

    def test_dedup_keys_start_with_the_watcher_and_hash_unsafe_parts(self) -> None:
        """A key is '<watcher>:<parts>'; a long or control-character part becomes its SHA-256."""
        assert make_dedup_key("w", "nats", "S", "7") == "w:nats:S:7"
        long_key = make_dedup_key("w", "x" * 500)
        assert long_key.startswith("w:sha256:") and len(long_key) < 100
        assert make_dedup_key("w", "a\nb").startswith("w:sha256:")
        assert make_dedup_key("w", "a\nb") != make_dedup_key("w", "a\nc")

    @pytest.mark.parametrize(
        ("url", "shown"),
        [
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            ("amqp://guest:pw@h/", "amqp://guest:***@h/"),
            ("nats://token@h:4222", "nats://***@h:4222"),
            ("mqtt://h:1883", "mqtt://h:1883"),
        ],
    )
    def test_urls_are_redacted(self, url: str, shown: str) -> None:
        """Passwords and bare tokens are replaced by ***; a URL without them is unchanged."""
        assert redact_url(url) == shown


class TestExtras:
    def test_the_package_imports_without_any_broker_client(self) -> None:
        """watchkeeper.watchers imports with every client missing; building a watcher whose
        extra is missing raises an ImportError naming the extra to install."""
        script = (
            "import sys\n"
            "for name in ('redis', 'nats', 'aio_pika', 'aiormq', 'paho'):\n"
            "    sys.modules[name] = None\n"
            "import watchkeeper.watchers as w\n"
            "for cls, kwargs, extra in [\n"
            "    (w.RedisStreamWatcher, {'stream': 's'}, 'redis'),\n"
            "    (w.NatsJetStreamWatcher, {'stream': 'S'}, 'nats'),\n"
            "    (w.RabbitMQWatcher, {'queue': 'q'}, 'rabbitmq'),\n"
            "    (w.MqttWatcher, {'topics': 't'}, 'mqtt'),\n"
            "]:\n"
            "    try:\n"
            "        cls(**kwargs)\n"
            "    except ImportError as exc:\n"
            '        assert f"watchkeeper-watchers[{extra}]" in str(exc), exc\n'
            "    else:\n"
            "        raise SystemExit(f'{cls.__name__} was built without its client')\n"
            "print('ok')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ok"
