"""What the AWS watchers (``S3PrefixWatcher``, ``SqsWatcher``) share: their aiobotocore
client, the errors a call raises, which of them no retry cures, and the secrets to scrub.

Both call AWS the same way: one client per ``run()``, botocore's own retries off (a watcher
retries with its own backoff, and reports the source as troubled meanwhile), every call
bounded, credentials from botocore's chain and never in a message.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any

from ._broker import BrokerSourceError, scrub, url_secrets
from ._common import close_bounded, import_off_loop

__all__ = ["AwsClient", "aws_errors", "aws_secrets", "failure_reason"]

_CREDENTIALS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
"""Environment variables whose values must never appear in a message."""


def aws_secrets(*urls: str | None) -> list[str]:
    """The secrets to scrub from a client's error texts: those in ``urls`` (``None`` skipped)
    and the secret key and session token of the environment."""
    found = url_secrets(*filter(None, urls))
    for variable in _CREDENTIALS:
        value = os.environ.get(variable)
        if value:
            found.append(value)
    return found


def aws_errors() -> tuple[type[BaseException], ...]:
    """What a call to AWS raises when it fails (botocore's errors, the network's, a timeout)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, OSError, TimeoutError)


def failure_reason(
    owner: str, action: str, exc: BaseException, fatal: Iterable[str], secrets: list[str]
) -> str:
    """The failed call's error as text, secrets scrubbed; raises :class:`BrokerSourceError`
    instead when AWS answered with an error code in ``fatal`` (no retry cures it: a missing
    queue or bucket, refused credentials)."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in fatal:
            raise BrokerSourceError(owner, action, exc, secrets) from exc
    return scrub(f"{type(exc).__name__}: {exc}", secrets)


class AwsClient:
    """One watcher's aiobotocore client: opened by its ``run()``, closed when ``run()`` ends,
    or by the watcher's ``cleanup()`` when ``run()`` was abandoned without being finalized."""

    def __init__(self) -> None:
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def connected(self) -> bool:
        """Whether a client is open."""
        return self._stack is not None

    async def open(
        self,
        owner: str,
        service: str,
        *,
        region: str | None,
        endpoint_url: str | None,
        call_timeout: float,
        read_timeout: float,
        secrets: list[str],
    ) -> Any:
        """A client of ``service`` (``"s3"``, ``"sqs"``), its library imported off the loop.

        :raises BrokerSourceError: no client can be made (no region, a malformed endpoint):
            no retry cures that.
        """
        await import_off_loop("aiobotocore.session", "aiobotocore.config", "botocore.exceptions")
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = AioConfig(
            connect_timeout=call_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": 1, "mode": "standard"},
        )
        stack = contextlib.AsyncExitStack()
        self._stack = stack
        try:
            return await stack.enter_async_context(
                get_session().create_client(
                    service, region_name=region, endpoint_url=endpoint_url, config=config
                )
            )
        except Exception as exc:
            raise BrokerSourceError(owner, "creating the client", exc, secrets) from exc

    async def aclose(self) -> None:
        """Close the client, if one is open (shielded, bounded)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await close_bounded(stack.aclose)
