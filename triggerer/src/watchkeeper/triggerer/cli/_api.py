"""``watchkeeper api`` (the HTTP API without watchers) and ``watchkeeper tokens``.

``api`` serves the same API, metrics and page as the daemon, for a separate operations host:
it reads and writes the store, and records watcher controls that the daemons act on.
``tokens create`` prints the new token once, alone on stdout (its note goes to stderr); the
store keeps only a salted hash of it.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._common import (
    CommandError,
    UsageError,
    console,
    emit,
    emit_json,
    emit_listing,
    int_at_least,
    int_between,
    json_flag,
    open_backend,
    run_async,
    store_handler,
)

if TYPE_CHECKING:
    from watchkeeper.store import BaseStateBackend
    from watchkeeper.store.protocols import ApiToken

    from ..settings import Settings
    from ._common import Subparsers

__all__ = ["register"]


# -- watchkeeper api ------------------------------------------------------------------------------


async def _serve(settings: Settings) -> None:
    import anyio
    from watchkeeper.store.protocols import get_logger

    from .._core import notify
    from ..api import serve_api

    log = get_logger(__name__)

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async with open_backend(settings) as backend, anyio.create_task_group() as tg:
            await tg.start(functools.partial(serve_api, backend, settings.api))
            notify(READY=1, STATUS=f"serving on {settings.api.host}:{settings.api.port}")
            async for signum in received:
                log.info("api_stopping", signal=signal.Signals(signum).name)
                notify(STOPPING=1)
                break
            tg.cancel_scope.cancel()


def _host(text: str) -> str:
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name or address")
    return text


def api_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--host`` and ``--port`` (overriding ``[api] host`` and ``port``) to ``parser``."""
    parser.add_argument("--host", metavar="HOST", type=_host, help="overrides [api] host")
    parser.add_argument(
        "--port", metavar="PORT", type=int_between(0, 65535), help="overrides [api] port"
    )


def with_api_options(settings: Settings, args: argparse.Namespace) -> Settings:
    """``settings`` with ``[api] host`` and ``port`` replaced by ``--host``/``--port``."""
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if not changes:
        return settings
    return settings.model_copy(update={"api": settings.api.model_copy(update=changes)})


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from ..api import ApiListenError

    settings = with_api_options(settings, args)
    open_backend(settings)  # a configuration mistake is a usage error before anything starts
    try:
        run_async(_serve, settings, event_loop=settings.triggerer.event_loop)
    except ApiListenError as exc:
        raise CommandError(str(exc)) from None
    return 0


# -- watchkeeper tokens ---------------------------------------------------------------------------


async def _create(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:

    from ..api import make_token

    store = backend.controls
    expires = None if args.expires_in is None else timedelta(days=args.expires_in)
    try:
        text, row = make_token(args.name, args.scope, now=datetime.now(UTC), expires_in=expires)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    await store.acreate_token(row)
    if args.json:
        emit_json({"name": row.name, "token": text, "scopes": list(row.scopes)})
    else:
        emit(text)  # alone on stdout: TOKEN=$(watchkeeper tokens create ...) keeps just it
        sys.stderr.write(
            f"token {row.name!r} ({', '.join(row.scopes)}): shown once, only its hash is kept\n"
        )
    return 0


async def _list(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:

    rows = await backend.controls.alist_tokens()
    now = datetime.now(UTC)

    def state(expires: datetime | None, revoked: datetime | None) -> str:
        if revoked is not None:
            return "revoked"
        if expires is not None and expires <= now:
            return "expired"
        return "active"

    def record(row: ApiToken) -> dict[str, Any]:
        return {
            "name": row.name,
            "scopes": list(row.scopes),
            "created_at": row.created_at,
            "expires_at": row.expires_at,
            "revoked_at": row.revoked_at,
            "state": state(row.expires_at, row.revoked_at),
        }

    if emit_listing(rows, args.json, record, "no tokens"):
        return 0
    from ._table import PlainTable

    table = PlainTable("name", "scopes", "state", "created", "expires")
    for row in rows:
        table.add_row(
            row.name,
            " ".join(row.scopes),
            state(row.expires_at, row.revoked_at),
            row.created_at.isoformat(timespec="seconds"),
            "-" if row.expires_at is None else row.expires_at.isoformat(timespec="seconds"),
        )
    console().print(table)
    return 0


async def _revoke(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:

    if not await backend.controls.arevoke_token(args.name):
        raise CommandError(f"no active token named {args.name!r}")
    emit(f"token {args.name!r} revoked")
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``api`` and ``tokens`` to the ``watchkeeper`` parser."""
    api = subparsers.add_parser(
        "api",
        help="serve the HTTP API, /metrics and the web page without running watchers",
        description="Serve the API until SIGTERM or SIGINT (for a separate operations host).",
    )
    api_options(api)
    api.set_defaults(handler=_api, long_running=True)

    tokens = subparsers.add_parser("tokens", help="create, list and revoke API tokens")
    actions = tokens.add_subparsers(dest="tokens_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a token and print it once")
    create.add_argument("name", metavar="NAME", help="the token's name (writes are 'api:NAME')")
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        metavar="SCOPE",
        help="read, operate, admin, write:asset:<name or glob> or push:asset:<name or glob>; "
        "repeat for several",
    )
    create.add_argument(
        "--expires-in", type=int_at_least(1), metavar="DAYS", help="expire after DAYS days"
    )
    json_flag(create, "the token")
    create.set_defaults(handler=store_handler(_create))
    list_ = actions.add_parser("list", help="names, scopes and states (never the tokens)")
    json_flag(list_, "one token per line")
    list_.set_defaults(handler=store_handler(_list))
    revoke = actions.add_parser("revoke", help="revoke a token at once")
    revoke.add_argument("name", metavar="NAME")
    revoke.set_defaults(handler=store_handler(_revoke))
