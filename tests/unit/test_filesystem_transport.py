"""The no-server broker of the demo and examples: every message arrives whole and in order."""

from __future__ import annotations

import os
from pathlib import Path

from kombu import Connection, Exchange, Queue

TRANSPORT = "celery_flowcontrol.testing.filesystem:AtomicFilesystemTransport"


def fresh_queue(name: str) -> Queue:
    """A queue and exchange named for one test: kombu keeps the filesystem transport's
    declarations in process-wide state, so a name reused by a later test would skip binding."""
    return Queue(name, Exchange(name), routing_key=name)


def connection(folder: Path) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder / "control")}
    return Connection("filesystem://", transport=TRANSPORT, transport_options=options)


def test_messages_sent_within_one_millisecond_arrive_whole_and_in_order(tmp_path: Path) -> None:
    queue = fresh_queue("order")
    with connection(tmp_path) as conn:
        with conn.Producer() as producer:
            for i in range(300):  # far more than one per millisecond
                producer.publish({"n": i}, exchange=queue.exchange, routing_key="order", declare=[queue])
        got: list[int] = []
        with conn.SimpleQueue(queue) as simple:
            while len(got) < 300:
                message = simple.get(timeout=2)
                got.append(message.payload["n"])
                message.ack()
    assert got == list(range(300))


def test_a_file_still_being_written_is_not_taken(tmp_path: Path) -> None:
    """The transport writes under ``<name>.part`` and renames: a file under that name is one
    the consumer's listing skips (it matches only ``<queue>.msg``), so a reader never takes
    a message before it is whole."""
    queue = fresh_queue("partial")
    (tmp_path / "0_x.partial.msg.part").write_bytes(b"")
    with connection(tmp_path) as conn:
        with conn.Producer() as producer:
            producer.publish({"n": 1}, exchange=queue.exchange, routing_key="partial", declare=[queue])
        with conn.SimpleQueue(queue) as simple:
            message = simple.get(timeout=2)
            assert message.payload == {"n": 1}
            message.ack()
    assert "0_x.partial.msg.part" in os.listdir(tmp_path)
