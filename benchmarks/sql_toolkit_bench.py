"""Per-statement client cost of a SQL toolkit on the store's hot write path, against the
hand-written statement text the PostgreSQL backend builds once per schema.

Not a test, and not run by CI: SQLAlchemy is not a dependency of the project. Run it in a
virtual environment of its own, with ``sqlalchemy`` installed:

    uv venv /tmp/sa && uv pip install --python /tmp/sa/bin/python sqlalchemy
    /tmp/sa/bin/python benchmarks/sql_toolkit_bench.py

It measures, in CPU time (``time.process_time``, so a busy machine inflates it less than wall
time), the batch upsert of asset state as SQLAlchemy Core expresses it (``json_to_recordset``
over a JSON parameter, ``ON CONFLICT DO UPDATE``, ``RETURNING``): building the construct, the
cache key a cached execution computes each time, and one uncompiled compile for the asyncpg
dialect. The hand-written path pays none of these per statement (a prebuilt string).
"""

from __future__ import annotations

import time
import timeit
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSON, insert

META = MetaData()
STATE = Table(
    "asset_state", META,
    Column("asset_id", BigInteger, primary_key=True), Column("key", Text, primary_key=True),
    Column("value", Text), Column("version", BigInteger),
    Column("updated_at", DateTime(timezone=True)), Column("writer_kind", Text),
    Column("writer_name", Text), Column("writer_try", Integer),
)  # fmt: skip


def build_upsert() -> Any:
    rows = (
        func.json_to_recordset(bindparam("docs", type_=JSON))
        .table_valued(Column("asset_id", BigInteger), Column("key", Text), Column("value", Text))
        .alias("i")
    )
    statement = insert(STATE).from_select(
        ["asset_id", "key", "value", "version", "updated_at"],
        select(rows.c.asset_id, rows.c.key, rows.c.value, literal_column("1"), func.now()),
    )
    return statement.on_conflict_do_update(
        index_elements=["asset_id", "key"],
        set_={
            "value": statement.excluded.value,
            "version": STATE.c.version + 1,
            "updated_at": statement.excluded.updated_at,
        },
    ).returning(STATE.c.asset_id, STATE.c.key, STATE.c.version)


def main() -> None:
    dialect = postgresql.asyncpg.dialect()
    built = build_upsert()
    rows = [
        ("build the construct", build_upsert, 5000),
        ("build + cache key (a cached run)", lambda: build_upsert()._generate_cache_key(), 5000),
        ("compile for asyncpg (uncached)", lambda: built.compile(dialect=dialect), 500),
        ("hand-written: a prebuilt str", lambda: None, 5000),
    ]
    for name, fn, number in rows:
        cost = timeit.timeit(fn, number=number, timer=time.process_time) / number * 1e6
        print(f"{name:34} {cost:8.1f} us")
    print("load", Path("/proc/loadavg").read_text().strip())


if __name__ == "__main__":
    main()
