"""Park + wake throughput of the parking store vs a raw SQLAlchemy insert of the same row.

One "park + wake" is what a denied task costs the database: ``park`` (insert, durable commit),
``claim_due(limit=1)`` (lease it), ``woken`` (after the republish: remember the row as woken,
then delete it): each a short transaction of one row. The baseline is the cheapest durable
write of that row: a SQLAlchemy Core insert in its own transaction
(``with engine.begin(): conn.execute(insert(...), row)``), with the same durability (SQLite
WAL + ``synchronous=FULL``; PostgreSQL defaults, ``synchronous_commit=on``).
Target: park + wake at >= 0.5 x the raw insert rate.

The store's third row, ``durable_wake=True``, makes the delete wait for the disk as well (see
ParkingStore's docstring): what the default saves, in the same run.

Measurements alternate (raw, store, raw, store, ...) so a noisy neighbour on a shared machine
hits both alike. SQLite runs in a temporary file, PostgreSQL in a throwaway schema.

    python benchmarks/parking.py [--seconds 4] [--postgres-url URL] [--no-postgres]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, MetaData, Table, create_engine, event, insert, inspect, text
from sqlalchemy.engine import make_url

from celery_flowcontrol.parking import ParkedMessage, ParkingStore, migrate
from celery_flowcontrol.parking.model import ParkedRow
from celery_flowcontrol.parking.rows import row_values

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TARGET = 0.5
ROUNDS = 4  # per measurement; each round is seconds / ROUNDS long


def celery_like_message(task_id: str, wake_at: float) -> ParkedMessage:
    """A message shaped like a Celery protocol-2 task: ~300-byte JSON body, the usual headers."""
    body = (
        b'[["user-42", "welcome"], {"template": "welcome", "locale": "en", "retries": 3}, '
        b'{"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
    )
    headers: dict[str, Any] = {
        "lang": "py", "task": "app.tasks.send_mail", "id": task_id, "shadow": None, "eta": None,
        "expires": None, "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
        "root_id": task_id, "parent_id": None, "argsrepr": "('user-42', 'welcome')",
        "kwargsrepr": "{'template': 'welcome', 'locale': 'en', 'retries': 3}",
        "origin": "gen1234@web-1", "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None,
        "stamps": {}, "flow_queue": "emails", "flow_priority": 0, "fairness_key": "tenant-7",
    }  # fmt: skip
    properties = {
        "correlation_id": task_id, "reply_to": "3c9a5d2e-7b1f-3a44-9b8e-1f2e3d4c5b6a", "delivery_mode": 2,
        "priority": 0, "body_encoding": "base64",
    }  # fmt: skip
    return ParkedMessage(
        task_id=task_id, queue="emails", body=body, wake_at=wake_at, task_name="app.tasks.send_mail",
        fairness_key="tenant-7", headers=headers, properties=properties, exchange="",
        routing_key="celery", reason="concurrency",
    )  # fmt: skip


# -- the two workloads -------------------------------------------------------------------------


def raw_insert(engine: Engine, table: Table) -> Callable[[str], None]:
    """One row per transaction, SQLAlchemy Core, nothing else (the row is encoded once, ahead)."""
    template = row_values(celery_like_message("template", time.time()), parked_at=time.time())

    def step(task_id: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert(table), {**template, "task_id": task_id})

    return step


def park_and_wake(store: ParkingStore) -> Callable[[str], None]:
    """park, claim_due(limit=1), woken: the life of one parked task in the table."""

    def step(task_id: str) -> None:
        now = time.time()
        if not store.park(celery_like_message(task_id, now - 1)):
            raise AssertionError(f"{task_id} was not parked")
        claimed = store.claim_due(now, limit=1)
        if [m.task_id for m in claimed] != [task_id]:
            raise AssertionError(f"claimed {claimed!r}, expected {task_id}")
        store.wakes.record(claimed, [task_id])

    return step


def measure(steps: dict[str, Callable[[str], None]], seconds: float) -> dict[str, float]:
    """Operations per second of each step, rounds interleaved; each step warmed up first."""
    ids = (f"{uuid.uuid4().hex[:8]}-{n}" for n in itertools.count())
    for step in steps.values():
        for _ in range(20):
            step(next(ids))
    done = dict.fromkeys(steps, 0)
    spent = dict.fromkeys(steps, 0.0)
    for _ in range(ROUNDS):
        for name, step in steps.items():
            started = time.perf_counter()
            deadline = started + seconds / ROUNDS
            while time.perf_counter() < deadline:
                step(next(ids))
                done[name] += 1
            spent[name] += time.perf_counter() - started
    return {name: done[name] / spent[name] for name in steps}


# -- databases ---------------------------------------------------------------------------------


def bench_table(engine: Engine) -> Table:
    """A copy of the migrated flowcontrol_parked for the raw inserts, in the same database: the
    same columns, constraints and indexes, so both arms maintain the same index entries."""
    table = ParkedRow.__table__.to_metadata(MetaData(), name="bench_raw_parked")  # type: ignore[attr-defined]
    # The copy loses the model's ddl_if(): keep only the indexes this database really has (on
    # SQLite the PostgreSQL-only rank index would otherwise slow the baseline alone).
    migrated = {index["name"] for index in inspect(engine).get_indexes(ParkedRow.__tablename__)}
    for index in list(table.indexes):
        if index.name not in migrated:
            table.indexes.discard(index)
    # Constraint and index names are per schema in PostgreSQL: let these be the copy's own.
    for constraint in table.constraints:
        constraint.name = None
    for index in table.indexes:
        index.name = f"bench_{index.name}"
    table.metadata.create_all(engine)
    return table


@contextmanager
def sqlite_database() -> Iterator[tuple[str, Engine]]:
    """A temporary SQLite file, and a plain engine on it with the store's durability."""
    folder = tempfile.mkdtemp(prefix="fc-bench-")
    url = f"sqlite:///{folder}/parking.sqlite3"
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _durable(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA journal_mode = WAL")
        dbapi_connection.execute("PRAGMA synchronous = FULL")

    try:
        yield url, engine
    finally:
        engine.dispose()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def postgres_database(base_url: str) -> Iterator[tuple[str, Engine]]:
    """A throwaway schema (dropped at the end), and a plain engine whose search_path is it."""
    schema = f"fc_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    url_text = url.render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        yield url_text, engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def run(label: str, url: str, engine: Engine, seconds: float) -> list[tuple[str, str, float, float]]:
    """Measure one database; rows of (database, operation, ops/s, ratio to the raw insert)."""
    migrate(url)
    table = bench_table(engine)
    store = ParkingStore(url)
    durable = ParkingStore(url, durable_wake=True)
    try:
        rates = measure(
            {
                "raw": raw_insert(engine, table),
                "store": park_and_wake(store),
                "durable": park_and_wake(durable),
            },
            seconds,
        )
    finally:
        store.close()
        durable.close()
    raw = rates["raw"]
    return [
        (label, "raw insert, 1 row/transaction (baseline)", raw, 1.0),
        (label, "park + wake: park, claim_due, woken", rates["store"], rates["store"] / raw),
        (label, "  same, durable_wake=True", rates["durable"], rates["durable"] / raw),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; exit 1 if a park + wake ratio misses the target."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="per measurement (default 4)")
    parser.add_argument("--postgres-url", default=os.environ.get("FLOWCONTROL_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)

    rows: list[tuple[str, str, float, float]] = []
    with sqlite_database() as (url, engine):
        rows += run("SQLite (WAL, synchronous=FULL)", url, engine, args.seconds)
    if not args.no_postgres:
        with postgres_database(args.postgres_url) as (url, engine):
            rows += run("PostgreSQL (synchronous_commit=on)", url, engine, args.seconds)

    width = max(len(r[0]) for r in rows)
    print(f"{'database':<{width}}  {'operation':<42} {'ops/s':>8}  {'vs raw':>6}")
    print("-" * (width + 62))
    for database, operation, rate, ratio in rows:
        print(f"{database:<{width}}  {operation:<42} {rate:>8,.0f}  {ratio:>6.2f}")
    ratios = [ratio for _, operation, _, ratio in rows if operation.startswith("park + wake")]
    ok = all(ratio >= TARGET for ratio in ratios)
    print(f"\ntarget: park + wake >= {TARGET} x raw insert: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
