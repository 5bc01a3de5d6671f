"""``S3PrefixWatcher``: one event per new object under a prefix of an S3 bucket, exactly once.

The rule it follows (a replayable source: the position is committed with the events): S3
lists a prefix in key order (UTF-8 bytes, which is Python's order of ``str``), so the watcher
keeps a watermark on keys and lists the prefix ``page_size`` keys at a time with
``ListObjectsV2`` (``StartAfter`` the bottom of its window, then the continuation token).
The new objects of a page are committed as one :class:`~watchkeeper.triggerer.TriggerEventBatch`
with the window after them, in one transaction, so a restarted watcher neither misses nor
repeats an object.

Keys do not always land in key order: two producers write ``…/10-05-a.json`` and
``…/10-04-b.json``, and the second becomes visible after the first. Such a *late* object sorts
before the watermark; it is caught inside a lag window (the helper of :mod:`._window`, the
one :class:`~watchkeeper.watchers.SqlTableWatcher` uses) that spans, in key space, the keys
emitted whose ``LastModified`` lies within ``lag_window`` seconds of the newest one emitted:

- the window is ``(floor, watermark]``: each poll lists from just after the floor, and an
  object inside the window is emitted unless its version (key, ETag and ``LastModified``) is
  among the versions recently emitted, which travel in the state;
- the floor rises to the greatest key below every key emitted within the last ``lag_window``
  seconds; an object at or below the floor is never emitted (the bound on how late an object
  may be), and neither is a version written over a key there;
- at most :attr:`S3PrefixWatcher.recent_limit` versions and about 32 KiB are remembered: a
  burst larger than that inside the window raises the floor instead of emitting anything
  twice (logged once as ``lag_window_overflow``).

A key written over with new content inside the window (a new ETag) is emitted again, as a new
version; the same content put again (a producer's retry: the same ETag, a later
``LastModified``) is not, and the same version listed again never is.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio
from pydantic import Field, ValidationInfo, field_validator, model_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._aws import AwsClient, aws_errors, aws_secrets, failure_reason
from ._broker import reconnect_delay, redact_url
from ._common import sleep_jittered, sleep_spread
from ._params import OptionalText, ReadyMadeWatcher, Seconds, SecondsOrZero, Text, WatcherParams
from ._window import LagWindow
from ._window_state import MAX_RECENT_BYTES, WindowState

__all__ = ["S3PrefixParams", "S3PrefixWatcher"]

log = get_logger(__name__)

Item = tuple[str, str]
"""``(key, version)``: an object's key and ``"<LastModified in ms> <ETag> <key>"``."""

_RECONNECT_MAX = 30.0
"""The longest wait between two listings while S3 cannot be reached."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_MAX_KEY_BYTES = 1024
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_FATAL_CODES = frozenset(
    {
        "NoSuchBucket",
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "InvalidBucketName",
        "InvalidToken",
        "ExpiredToken",
        "SignatureDoesNotMatch",
        "PermanentRedirect",
        "AuthorizationHeaderMalformed",
    }
)
"""Error codes that no retry cures: ``run()`` raises at once (the daemon's backoff applies)."""


def _key_text(name: str, value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{name} must not hold a NUL character")
    if len(value.encode("utf-8", "surrogatepass")) > _MAX_KEY_BYTES:
        raise ValueError(f"{name} must be at most {_MAX_KEY_BYTES} bytes (S3's longest key)")
    return value


class S3PrefixParams(WatcherParams):
    """The parameters of :class:`S3PrefixWatcher`."""

    bucket: Text
    """The bucket's name (not a URL: ``s3://bucket/prefix`` is ``bucket`` plus ``prefix``)."""
    prefix: str = ""
    """Only keys starting with this (``""``: the whole bucket); usually ending in ``/``."""
    region: OptionalText = None
    """The AWS region (default: botocore's configuration, ``AWS_DEFAULT_REGION``)."""
    endpoint_url: OptionalText = None
    """Another S3 endpoint (a VPC endpoint, MinIO, a local emulator); default: AWS's."""
    pattern: OptionalText = None
    """A glob the whole key must match (``fnmatch``, case-sensitive; ``*`` also matches
    ``/``), such as ``"in/*.csv"``; ``None``: every key."""
    min_size: Annotated[int, Field(ge=0)] = 0
    """Objects smaller than this many bytes are not emitted (``1`` skips empty markers)."""
    start_after: OptionalText = None
    """On the first run (no state yet), emit only the keys after this one (S3's
    ``StartAfter``); ``None``: every object already there."""
    page_size: Annotated[int, Field(ge=1, le=1000)] = 1000
    """Keys per listing call (S3 returns at most 1,000); the new objects of one page commit
    as one batch."""
    poll_interval: Seconds = 10.0
    """Seconds between two listings once caught up, with jitter (each listing call costs a
    LIST request)."""
    lag_window: SecondsOrZero = 60.0
    """Seconds of ``LastModified`` behind the newest object emitted within which an object
    whose key sorts before the watermark is still caught."""
    call_timeout: Seconds = 30.0
    """Seconds each listing call may take before it is abandoned and retried."""

    @field_validator("bucket")
    @classmethod
    def _bucket_is_a_name(cls, value: str, info: ValidationInfo) -> str:
        if value.lower().startswith(("s3://", "s3a://", "http://", "https://")):
            raise ValueError(
                f"bucket must be a bucket's name, not a URL (got {value!r}: give "
                "bucket='name' and prefix='path/')"
            )
        if "/" in value:
            raise ValueError(
                f"bucket must be a bucket's name without '/' (got {value!r}: the part after "
                "the first '/' goes in prefix)"
            )
        if not _BUCKET.match(value):
            raise ValueError(
                f"bucket {value!r} is not a bucket name (3 to 255 letters, digits, '.', '-' "
                "or '_', starting with a letter or digit)"
            )
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_key(cls, value: str) -> str:
        return _key_text("prefix", value)

    @field_validator("start_after")
    @classmethod
    def _start_after_is_a_key(cls, value: str | None) -> str | None:
        return None if value is None else _key_text("start_after", value)

    @model_validator(mode="after")
    def _pattern_can_match(self) -> S3PrefixParams:
        pattern = self.pattern
        if pattern is not None and self.prefix:
            # A glob whose literal head contradicts the prefix matches nothing: say so now.
            head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
            common = min(len(head), len(self.prefix))
            if head[:common] != self.prefix[:common]:
                raise ValueError(
                    f"pattern {pattern!r} matches whole keys, and no key under prefix "
                    f"{self.prefix!r} can match it (write it as {self.prefix + '*'!r}...)"
                )
        return self


class S3PrefixWatcher(ReadyMadeWatcher[S3PrefixParams]):
    """Yields one event per new object under a prefix of an S3 bucket.

    The payload is ``{"bucket", "key", "uri", "size", "etag", "last_modified",
    "storage_class"}``: the object's key, ``s3://bucket/key``, its size in bytes, its ETag
    (without quotes), its ``LastModified`` (ISO 8601) and storage class. Keys ending in ``/``
    (the folder markers of the S3 console) are skipped; ``pattern`` and ``min_size`` filter
    the rest. On the first run every object already under the prefix is emitted (or those
    after ``start_after``).

    Each poll lists the prefix from the bottom of the lag window on, ``page_size`` keys per
    call, and commits the new objects of each page as one
    :class:`~watchkeeper.triggerer.TriggerEventBatch` with the window after them: the events
    and the position commit together or not at all, so a watcher killed anywhere resumes from
    its last committed page and emits each object once. No ``dedup_key`` is needed: the
    versions emitted inside the window travel in the state (see the module's documentation
    for the window, and :mod:`._window_state` for its layout).

    Listing finds what is new only by reading it: a poll costs one LIST request per
    ``page_size`` keys from the window's bottom on, and an object is seen up to
    ``poll_interval`` seconds after it lands. For latency in seconds, or a prefix whose keys
    do not grow with time (random names), use S3's event notifications to an SQS queue read
    by :class:`~watchkeeper.watchers.SqsWatcher` (``docs/s3-watchers.md``).

    Credentials come from botocore's usual chain (``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role); they are never parameters,
    so never serialized, and the secret key and session token never appear in a message.
    Permission needed: ``s3:ListBucket`` on the bucket.

    Connection: every call is bounded (``call_timeout``). While the endpoint cannot be
    reached (or throttles, or answers 5xx) the watcher retries with a growing delay up to
    30 s, for as long as it takes, its status ``backing_off`` with the reason, and
    ``running`` again once a listing succeeds. A missing bucket or refused credentials make
    ``run()`` raise :class:`~watchkeeper.watchers.BrokerSourceError` at once (the daemon
    restarts the watcher with its backoff).

    State keys (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.watermark``: ``{"kind": "str", "cursor": <the greatest key emitted>, "key":
      <its version>}``;
    - ``<name>.recent``: ``{"floor", "cursors", "keys"}``, the keys and versions emitted
      inside the window, and the floor (the key the next listing starts after).

    How to rewind it: stop the watcher, set ``<name>.watermark`` to
    ``{"kind": "str", "cursor": K, "key": ""}`` and ``<name>.recent`` to
    ``{"floor": K, "cursors": [], "keys": []}``, start it again: it emits the objects whose
    keys sort after ``K``. Delete both keys to emit every object under the prefix again.

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = S3PrefixParams
    positional = 2
    client = ("aiobotocore", "s3")

    recent_limit: int = 1000
    """At most this many recently emitted versions are kept in the state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aws = AwsClient()
        self._name = f"{type(self).__name__}({self.params.bucket!r}, {self.params.prefix!r})"

    def __repr__(self) -> str:
        endpoint = self.params.endpoint_url
        return (
            f"<{type(self).__name__} bucket={self.params.bucket!r} "
            f"prefix={self.params.prefix!r} "
            f"endpoint_url={None if endpoint is None else redact_url(endpoint)!r} "
            f"connected={self._aws.connected}>"
        )

    def _secrets(self) -> list[str]:
        return aws_secrets(self.params.endpoint_url)

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        p = self.params
        state: WindowState[str, str] = WindowState(
            self._name,
            type(self).__name__,
            self.watcher_name,
            lower=_whole_window,
            size_of=_size_of,
            max_keys=self.recent_limit,
            kinds=("str",),
            key_types=(str,),
        )
        window = await state.aload(self.asset_state_store)
        if window.watermark is None and p.start_after is not None:
            window = state.new_window(floor=p.start_after)
        secrets = self._secrets()
        failures = 0
        try:
            client = await self._aws.open(
                self._name,
                "s3",
                region=p.region,
                endpoint_url=p.endpoint_url,
                call_timeout=p.call_timeout,
                read_timeout=p.call_timeout,
                secrets=secrets,
            )
            await sleep_spread(min(p.poll_interval, 1.0))
            while True:
                token: str | None = None
                start = window.floor
                while True:
                    arguments: dict[str, Any] = {
                        "Bucket": p.bucket,
                        "Prefix": p.prefix,
                        "MaxKeys": p.page_size,
                    }
                    if token is not None:
                        arguments["ContinuationToken"] = token
                    elif start is not None:
                        arguments["StartAfter"] = start
                    try:
                        with anyio.fail_after(p.call_timeout + 5):
                            page = await client.list_objects_v2(**arguments)
                    except aws_errors() as exc:
                        failures = self._failed(exc, failures, secrets)
                        await anyio.sleep(reconnect_delay(failures, cap=_RECONNECT_MAX))
                        break  # list again from the window's bottom
                    if failures:
                        failures = 0
                        log.info("s3_reachable", watcher=self.watcher_name)
                        self.report_source(None)
                    contents: list[dict[str, Any]] = page.get("Contents") or []
                    found = self._accepted(window, contents)
                    if found:
                        emitted = [item for item, _ in found]
                        listed = contents[-1]["Key"]
                        after = _advance(state, window, emitted, p.lag_window, listed)
                        events = [TriggerEvent(self._payload(obj)) for _, obj in found]
                        yield TriggerEventBatch(events, state=state.state(after))
                        window = after  # committed
                    token = page.get("NextContinuationToken")
                    if not page.get("IsTruncated") or not token:
                        break
                if not failures:
                    await sleep_jittered(p.poll_interval)
        finally:
            await self._aws.aclose()

    async def cleanup(self) -> None:
        """Close the client if ``run()`` was abandoned without being finalized."""
        await self._aws.aclose()

    def _accepted(
        self, window: LagWindow[str, str], contents: list[dict[str, Any]]
    ) -> list[tuple[Item, dict[str, Any]]]:
        """The objects of a listed page to emit, in key order, with their ``(key, version)``.

        An object whose key and ETag the window remembers is not emitted again, even with a
        later ``LastModified``: the same bytes put again (a producer's retry) are no new
        object.
        """
        p = self.params
        found: list[tuple[Item, dict[str, Any]]] = []
        remembered: set[str] | None = None
        for obj in contents:
            key = obj["Key"]
            if key.endswith("/") or int(obj.get("Size", 0)) < p.min_size:
                continue
            if p.pattern is not None and not fnmatch.fnmatchcase(key, p.pattern):
                continue
            version = _version(obj)
            if not window.accepts(key, version):
                continue
            if remembered is None:
                versions = window.keys()
                remembered = {_content(known) for known in versions}
            if _content(version) in remembered:
                continue  # the same content put again
            if not window.is_new(key, version):
                log.info("late_object", bucket=p.bucket, key=key)
            found.append(((key, version), obj))
        return found

    def _failed(self, exc: BaseException, failures: int, secrets: list[str]) -> int:
        """Count a failed listing: raise for what no retry cures, else report the source as
        unreachable and return the new count of failures in a row."""
        reason = failure_reason(self._name, "listing", exc, _FATAL_CODES, secrets)
        failures += 1
        where = redact_url(self.params.endpoint_url or "S3")
        log.warning("s3_unreachable", watcher=self.watcher_name, error=reason, attempt=failures)
        self.report_source(f"{self._name}: listing from {where} failed, retrying: {reason}")
        return failures

    def _payload(self, obj: dict[str, Any]) -> dict[str, Any]:
        bucket, key = self.params.bucket, obj["Key"]
        modified = obj.get("LastModified")
        return {
            "bucket": bucket,
            "key": key,
            "uri": f"s3://{bucket}/{key}",
            "size": int(obj.get("Size", 0)),
            "etag": str(obj.get("ETag", "")).strip('"'),
            "last_modified": None if modified is None else modified.isoformat(),
            "storage_class": obj.get("StorageClass"),
        }


def _version(obj: dict[str, Any]) -> str:
    """``"<LastModified in ms> <ETag> <key>"``: one version of one object. An ETag holds no
    space (RFC 9110), so the first two fields split off cleanly."""
    modified = obj.get("LastModified")
    ms = 0 if modified is None else (modified - _EPOCH) // _MS
    etag = str(obj.get("ETag", "")).strip('"').replace(" ", "")
    return f"{ms} {etag} {obj['Key']}"


def _content(version: str) -> str:
    """``"<ETag> <key>"`` of a version: what stays the same when the same bytes are put
    again."""
    return version.split(" ", 1)[1]


def _modified_ms(version: str) -> int:
    return int(version.split(" ", 1)[0])


def _whole_window(_key: str) -> str:
    """The window's start for :class:`LagWindow`: every key; the floor is the real bound."""
    return ""


def _size_of(key: str, version: str) -> int:
    return len(key.encode("utf-8", "surrogatepass")) + len(version.encode()) + 8


def _advance(
    state: WindowState[str, str],
    window: LagWindow[str, str],
    emitted: list[Item],
    lag: float,
    listed: str,
) -> LagWindow[str, str]:
    """The window once ``emitted`` (accepted by ``window``, in key order) are committed.

    The watermark moves to the greatest item; the floor rises to the greatest key below every
    key emitted within ``lag`` seconds of the newest ``LastModified``, but not past ``listed``
    (the last key this pass has listed: what lies beyond was not read yet, and an object there
    is not late), and further, key by key from the bottom, while the versions kept would
    exceed the window's bounds. That second rise does not pass ``listed`` either: the versions
    the window held fit its bounds, so the first one cut is one emitted now.
    """
    watermark = window.watermark
    for item in emitted:
        if watermark is None or item > watermark:
            watermark = item
    items = window.items() + emitted
    floor = window.floor
    newest = max(_modified_ms(version) for _, version in items)
    since = newest - round(lag * 1000)
    first = min(key for key, version in items if _modified_ms(version) >= since)
    below = [key for key, _ in items if key < first]
    if below:
        candidate = min(max(below), listed)
        if floor is None or candidate > floor:
            floor = candidate
    kept = sorted(item for item in items if floor is None or item[0] > floor)
    size = 0
    overflowed = False
    for index in range(len(kept) - 1, -1, -1):
        size += _size_of(*kept[index])
        if len(kept) - index > window.max_keys or size > MAX_RECENT_BYTES:
            floor = kept[index][0]
            kept = [item for item in kept[index + 1 :] if item[0] > floor]
            overflowed = True
            break
    after = state.new_window(watermark, kept, floor)
    after.overflowed = overflowed or window.overflowed
    return after
