"""The demo's fake source: a SQLite file whose tables receive numbered items.

It stands for an application database: a producer appends rows with ids 1, 2, 3, ... to each
table, one short transaction per row, while the example watchers in ``watchers/orders.py``
read them. ``watchkeeper demo`` imports this module; you can also run it by hand to feed the
example watchers of a daemon you started yourself::

    python examples/source.py demo-source.db --items 500 --rate 20
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.to_thread

TABLES = ("orders", "payments")


def create(path: Path | str, tables: Sequence[str] = TABLES) -> None:
    """Create the source database and its empty tables (blocking)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # readers never block the producer
        for table in tables:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, item TEXT NOT NULL)"
            )
        conn.commit()
    finally:
        conn.close()


def append(path: Path | str, n: int, tables: Sequence[str] = TABLES) -> None:
    """Commit item ``n`` (id ``n``) to every table, in one transaction (blocking)."""
    conn = sqlite3.connect(path, timeout=10)
    try:
        conn.execute("PRAGMA synchronous=OFF")  # a fake source: speed over durability
        with conn:
            for table in tables:
                conn.execute(
                    f"INSERT INTO {table} (id, item) VALUES (?, ?)", (n, f"{table[:-1]}-{n:05d}")
                )
    finally:
        conn.close()


def count(path: Path | str, table: str) -> int:
    """How many items ``table`` holds (blocking)."""
    conn = sqlite3.connect(path, timeout=10)
    try:
        (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(n)
    finally:
        conn.close()


async def produce(
    path: Path | str, items: int, *, rate: float, tables: Sequence[str] = TABLES
) -> None:
    """Append items 1..``items`` to every table, ``rate`` items per table per second."""
    for n in range(1, items + 1):
        await anyio.to_thread.run_sync(append, path, n, tables)
        await anyio.sleep(1 / rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the SQLite file to create and feed")
    parser.add_argument("--items", type=int, default=100, help="items per table")
    parser.add_argument("--rate", type=float, default=10.0, help="items per table per second")
    args = parser.parse_args()
    create(args.path)
    start = count(args.path, TABLES[0]) + 1
    for n in range(start, start + args.items):
        append(args.path, n)
        time.sleep(1 / args.rate)
    print(f"{args.path}: items {start}..{start + args.items - 1} appended to {', '.join(TABLES)}")


if __name__ == "__main__":
    main()
