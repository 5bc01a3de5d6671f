"""``SqsWatcher``: one event per message of an Amazon SQS queue, exactly once.

The rule it follows (commit, then acknowledge; a dedup key for what the source redelivers):
the watcher receives up to ``batch_size`` messages with one long poll, commits them as one
:class:`~watchkeeper.triggerer.TriggerEventBatch`, and only once that batch committed (the
generator resumes after the commit) deletes them from the queue with ``DeleteMessageBatch``.
Each event's ``dedup_key`` is ``<watcher name>:sqs:<queue name>:<MessageId>``; SQS keeps a
message's ``MessageId`` across redeliveries, so a message redelivered after a crash between
the commit and the delete (once its visibility timeout passed) writes nothing, and is deleted
then. Nothing is lost and nothing is emitted twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
from pydantic import Field
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._aws import AwsClient, aws_errors, aws_secrets, failure_reason
from ._broker import (
    BrokerSourceError,
    decode_body,
    make_dedup_key,
    reconnect_delay,
    redact_url,
    scrub,
)
from ._params import Count, OptionalText, ReadyMadeWatcher, Seconds, Text, WatcherParams

__all__ = ["SqsParams", "SqsWatcher"]

log = get_logger(__name__)

_REGION = re.compile(r"^https?://sqs[.-]([a-z0-9-]+)\.amazonaws\.com", re.IGNORECASE)
_FATAL_CODES = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "InvalidAddress",
    }
)
"""Error codes that no retry cures: ``run()`` raises at once (the daemon's backoff applies)."""


class SqsParams(WatcherParams):
    """The parameters of :class:`SqsWatcher`."""

    queue_url: Text
    """The queue's URL (``https://sqs.<region>.amazonaws.com/<account>/<name>``)."""
    region: OptionalText = None
    """The AWS region (default: the one in ``queue_url``, else botocore's configuration)."""
    endpoint_url: OptionalText = None
    """Another SQS endpoint (a VPC endpoint, a local emulator); default: AWS's."""
    batch_size: Annotated[int, Field(ge=1, le=10)] = 10
    """At most this many messages per receive, committed as one batch (SQS allows 10)."""
    wait_time: Annotated[int, Field(ge=0, le=20)] = 20
    """Seconds a receive waits for a first message (long polling; SQS allows 20)."""
    visibility_timeout: Annotated[int, Field(ge=1, le=43_200)] = 60
    """Seconds a received message stays hidden from other receives; a batch still in
    flight with less than half of it left is hidden this long again before it commits."""
    call_timeout: Seconds = 30.0
    """Seconds each call may take beyond its long poll before it is abandoned."""
    reconnect_attempts: Count = 60
    """Failed calls in a row (backing off up to 10 s apart) before ``run()`` raises."""


class SqsWatcher(ReadyMadeWatcher[SqsParams]):
    """Yields one batch of events per receive from an SQS queue (standard or FIFO).

    Each message is one event with the payload ``{"queue", "message_id", "sent",
    "receive_count", "group_id", "sequence_number", "attributes", "data"}``: the queue's
    name, the message's id, when it was sent (ISO 8601), how many times SQS handed it out
    (``ApproximateReceiveCount``), the FIFO message group and sequence number (null on a
    standard queue), the message attributes (``{name: string or {"base64": ...}}``, or
    null) and the body as JSON when it is UTF-8 JSON, else its text.

    The watcher long-polls (``wait_time`` seconds) for up to ``batch_size`` messages, hidden
    from other receives for ``visibility_timeout`` seconds, commits them as one batch, then
    deletes them with one ``DeleteMessageBatch``. Before the batch commits, if less than half
    of the visibility timeout is left (a slow receive), the messages are hidden for
    ``visibility_timeout`` seconds again (``ChangeMessageVisibilityBatch``), so a batch is not
    handed out again while it commits. Should the commit outlast it anyway, or a delete fail,
    or the daemon die between the commit and the delete, SQS redelivers those messages and
    their events are suppressed by their ``dedup_key`` (the ``MessageId``), then deleted.
    A FIFO queue hands out a message group's messages in order and no more of that group
    until the batch is deleted, so events of one group commit in order; SQS removes
    producer retries with one deduplication id itself. A standard queue is at-least-once and
    roughly ordered: the order of events is the order of receipt.

    Credentials come from botocore's usual chain (``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role); they are never parameters,
    so never serialized, and the secret key and session token never appear in a message.
    Permissions needed: ``sqs:ReceiveMessage``, ``sqs:DeleteMessage``,
    ``sqs:ChangeMessageVisibility``.

    Connection: every call is bounded (``wait_time`` + ``call_timeout`` seconds). While the
    endpoint cannot be reached (or throttles, or answers 5xx) the watcher retries with a
    growing delay, its status ``backing_off`` with the reason, and ``running`` again once a
    call succeeds; after ``reconnect_attempts`` failures in a row, or at once when the queue
    does not exist or the credentials are refused, ``run()`` raises
    :class:`BrokerSourceError` and the daemon restarts the watcher with its backoff.

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.message_id``: the ``MessageId`` of the last message committed, for people and
      ``watchkeeper status``. The queue itself is the position: a deleted message is gone.

    How to rewind it: SQS cannot; to replay, send the messages again (a DLQ redrive moves
    them back). Redriven messages keep their ``MessageId``, so those whose events are still
    remembered (``[events] dedup_retention_days``) are suppressed; to emit them anew, run
    the watcher under a new name (the keys start with it).

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = SqsParams
    positional = 1
    client = ("aiobotocore", "sqs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aws = AwsClient()
        self._queue = self.params.queue_url.rstrip("/").rsplit("/", 1)[-1]
        self._name = f"{type(self).__name__}({redact_url(self.params.queue_url)!r})"

    def __repr__(self) -> str:
        endpoint = self.params.endpoint_url
        return (
            f"<{type(self).__name__} queue_url={redact_url(self.params.queue_url)!r} "
            f"endpoint_url={None if endpoint is None else redact_url(endpoint)!r} "
            f"connected={self._aws.connected}>"
        )

    def _region(self) -> str | None:
        if self.params.region is not None:
            return self.params.region
        found = _REGION.match(self.params.queue_url)
        return found.group(1) if found else None

    def _secrets(self) -> list[str]:
        return aws_secrets(self.params.queue_url, self.params.endpoint_url)

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        secrets = self._secrets()
        key = f"{self.watcher_name}.message_id"
        bound = self.params.wait_time + self.params.call_timeout
        failures = 0
        troubled = False
        try:
            client = await self._aws.open(
                self._name,
                "sqs",
                region=self._region(),
                endpoint_url=self.params.endpoint_url,
                call_timeout=self.params.call_timeout,
                read_timeout=bound,
                secrets=secrets,
            )
            while True:
                try:
                    with anyio.fail_after(bound + 5):
                        answer = await client.receive_message(
                            QueueUrl=self.params.queue_url,
                            MaxNumberOfMessages=self.params.batch_size,
                            WaitTimeSeconds=self.params.wait_time,
                            VisibilityTimeout=self.params.visibility_timeout,
                            MessageSystemAttributeNames=["All"],
                            MessageAttributeNames=["All"],
                        )
                    received = time.monotonic()
                except aws_errors() as exc:
                    failures = self._failed(exc, "receiving", failures, secrets)
                    troubled = True
                    await anyio.sleep(reconnect_delay(failures))
                    continue
                failures = 0
                if troubled:
                    troubled = False
                    log.info("sqs_reachable", watcher=self.watcher_name)
                    self.report_source(None)
                messages: list[dict[str, Any]] = answer.get("Messages") or []
                if not messages:
                    continue
                if time.monotonic() - received > self.params.visibility_timeout / 2:
                    await self._hide_again(client, messages, secrets)
                events = [self._event(message) for message in messages]
                yield TriggerEventBatch(events, state={key: messages[-1]["MessageId"]})
                # Committed (or suppressed as a redelivery): the queue may forget them.
                await self._delete(client, messages, secrets)
        finally:
            await self._aws.aclose()

    async def cleanup(self) -> None:
        """Close the client if ``run()`` was abandoned without being finalized."""
        await self._aws.aclose()

    def _failed(self, exc: BaseException, action: str, failures: int, secrets: list[str]) -> int:
        """Count a failed call: raise for what no retry cures or after too many, else report
        the source as unreachable and return the new count of failures in a row."""
        reason = failure_reason(self._name, action, exc, _FATAL_CODES, secrets)
        failures += 1
        if failures > self.params.reconnect_attempts:
            raise BrokerSourceError(
                self._name, f"{action} ({failures} failures in a row)", exc, secrets
            ) from exc
        where = redact_url(self.params.endpoint_url or self.params.queue_url)
        log.warning("sqs_unreachable", watcher=self.watcher_name, error=reason, attempt=failures)
        self.report_source(f"{self._name}: {action} from {where} failed, retrying: {reason}")
        return failures

    def _call_failed(self, exc: BaseException, event: str, secrets: list[str]) -> None:
        """Log a failed extend or delete (the next receive reports an unreachable source)."""
        error = scrub(f"{type(exc).__name__}: {exc}", secrets)
        log.warning(event, watcher=self.watcher_name, error=error)

    async def _hide_again(
        self, client: Any, messages: list[dict[str, Any]], secrets: list[str]
    ) -> None:
        """Hide the batch for a whole visibility timeout again before it commits."""
        entries = [
            {
                "Id": str(index),
                "ReceiptHandle": message["ReceiptHandle"],
                "VisibilityTimeout": self.params.visibility_timeout,
            }
            for index, message in enumerate(messages)
        ]
        try:
            with anyio.fail_after(self.params.call_timeout + 5):
                await client.change_message_visibility_batch(
                    QueueUrl=self.params.queue_url, Entries=entries
                )
        except aws_errors() as exc:
            # Not extended: a redelivery of this batch, should there be one, is suppressed.
            self._call_failed(exc, "sqs_extend_failed", secrets)

    async def _delete(
        self, client: Any, messages: list[dict[str, Any]], secrets: list[str]
    ) -> None:
        """Delete a committed batch; what is not deleted comes back and is suppressed."""
        entries = [
            {"Id": str(index), "ReceiptHandle": message["ReceiptHandle"]}
            for index, message in enumerate(messages)
        ]
        try:
            with anyio.fail_after(self.params.call_timeout + 5):
                answer = await client.delete_message_batch(
                    QueueUrl=self.params.queue_url, Entries=entries
                )
        except aws_errors() as exc:
            # Not deleted: SQS redelivers them after the visibility timeout, suppressed then.
            self._call_failed(exc, "sqs_delete_failed", secrets)
            return
        for failed in answer.get("Failed") or []:
            log.warning(
                "sqs_delete_failed",
                watcher=self.watcher_name,
                message_id=messages[int(failed["Id"])]["MessageId"],
                code=failed.get("Code"),
            )

    def _event(self, message: dict[str, Any]) -> TriggerEvent:
        attributes = message.get("Attributes") or {}
        sent = attributes.get("SentTimestamp")
        return TriggerEvent(
            {
                "queue": self._queue,
                "message_id": message["MessageId"],
                "sent": None
                if sent is None
                else datetime.fromtimestamp(int(sent) / 1000, UTC).isoformat(),
                "receive_count": int(attributes.get("ApproximateReceiveCount", 1)),
                "group_id": attributes.get("MessageGroupId"),
                "sequence_number": attributes.get("SequenceNumber"),
                "attributes": _message_attributes(message.get("MessageAttributes")),
                "data": decode_body(message.get("Body", "").encode("utf-8")),
            },
            dedup_key=make_dedup_key(self.watcher_name, "sqs", self._queue, message["MessageId"]),
        )


def _message_attributes(attributes: dict[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    import base64

    shown: dict[str, Any] = {}
    for name, value in attributes.items():
        if "StringValue" in value:
            shown[name] = value["StringValue"]
        elif "BinaryValue" in value:
            shown[name] = {"base64": base64.b64encode(value["BinaryValue"]).decode("ascii")}
    return shown
