"""``watchkeeper airflow relay``: the bridge's subcommand of the ``watchkeeper`` command.

The ``watchkeeper`` command adds the subcommands that installed distributions declare in the
``watchkeeper.commands`` entry-point group; this distribution declares :func:`register`. It
imports nothing heavy: the relay (httpx, the store's drivers) loads when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watchkeeper.store import StoreSettings

__all__ = ["PASSWORD_VARIABLE", "register"]

PASSWORD_VARIABLE = "WATCHKEEPER_AIRFLOW_PASSWORD"
"""Where the relay reads the Airflow user's password (never from the command line, which
other users of the machine can read)."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``airflow relay`` to the ``watchkeeper`` command."""
    group = subparsers.add_parser("airflow", help="watchkeeper beside Apache Airflow 3.3")
    actions = group.add_subparsers(dest="airflow_command", metavar="ACTION", required=True)
    relay = actions.add_parser(
        "relay",
        help="forward committed events of some assets to Airflow's REST API, each once",
        description=(
            "Post each committed event of the given assets to Airflow "
            "(POST /api/v2/assets/events, the Airflow asset of the same name), exactly once "
            f"per event. The password is read from ${PASSWORD_VARIABLE}."
        ),
    )
    relay.add_argument("--airflow-url", required=True, metavar="URL", help="the api-server")
    relay.add_argument("--username", required=True, help="an Airflow user with the op role")
    relay.add_argument(
        "--asset",
        dest="assets",
        action="append",
        required=True,
        metavar="NAME",
        help="an asset to relay (repeat for several)",
    )
    relay.add_argument(
        "--name",
        default="airflow",
        help="the relay's name: its cursor and state (default: airflow)",
    )
    relay.add_argument(
        "--drain", action="store_true", help="exit once every committed event is relayed"
    )
    relay.set_defaults(handler=_relay, long_running=True)


def _relay(args: argparse.Namespace, settings: StoreSettings) -> int:
    import anyio
    from watchkeeper.store import open_state_backend

    from ._relay import AirflowRelay, RelayError, relay_settings

    password = os.environ.get(PASSWORD_VARIABLE)
    if password is None:
        return _fail(f"set ${PASSWORD_VARIABLE} to the Airflow user's password", 2)
    try:
        config = relay_settings(
            airflow_url=args.airflow_url,
            username=args.username,
            password=password,
            assets=args.assets,
            name=args.name,
        )
    except ValueError as exc:
        return _fail(str(exc), 2)

    async def main() -> None:
        async with open_state_backend(settings) as store:
            relay = AirflowRelay(store, config)
            if args.drain:
                count = await relay.drain()
                sys.stdout.write(
                    f"relayed {count} events ({relay.found} found already in Airflow)\n"
                )
            else:
                await relay.run()

    try:
        anyio.run(main)
    except RelayError as exc:
        return _fail(str(exc), 1)
    return 0


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"watchkeeper: error: {message}\n")
    return code
