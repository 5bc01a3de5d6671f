"""The demo's fake source: a SQLite file whose tables receive numbered items.

It stands for an application database: ``watchkeeper demo`` creates it, then appends rows with
ids 1, 2, 3, ... to each table, one short transaction per row, while the demo's watchers
(``_watchers/orders.py``, copied into the demo's watchers path) read them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TABLES", "append", "create"]

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
