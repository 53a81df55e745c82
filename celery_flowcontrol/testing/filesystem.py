"""A ``filesystem://`` broker transport that loses nothing: for demos, examples and tests.

kombu's filesystem transport (a folder of message files shared by every process on one
machine) is the no-server broker of the demo and the examples, but as shipped it can lose
messages (kombu issue #1551): ``_put`` creates the message file, then writes it, and a
consumer listing the folder in between takes the file and reads it empty; two processes
binding to an exchange whose table does not exist yet both create it and one binding is lost;
file names carry milliseconds, so two messages sent within one millisecond may be read out of
order. A worker republishes woken tasks from its own thread while it reads the folder, so all
of this happens under flow control.

Use it by path::

    app.conf.broker_url = "filesystem://"
    app.conf.broker_transport = "celery_flowcontrol.testing.filesystem:AtomicFilesystemTransport"
    app.conf.broker_transport_options = {"data_folder_in": d, "data_folder_out": d, ...}

It is a stand-in for a real broker on one machine, not for production.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps

from ..compat import exchange_table

__all__ = ["AtomicFilesystemChannel", "AtomicFilesystemTransport"]


class AtomicFilesystemChannel(filesystem.Channel):
    """kombu's filesystem channel, writing each message file and binding table atomically:
    written under a name the consumer ignores, then renamed (or linked) into place, so a
    file is complete whenever it can be seen."""

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        table = exchange_table(self, exchange)  # kombu builds it differently from 5.7 on
        if not table.exists():
            self.control_folder.mkdir(parents=True, exist_ok=True)
            partial = table.with_name(f"{table.name}.{uuid.uuid4().hex}.part")
            partial.write_text("[]")
            try:
                os.link(partial, table)  # atomic, and never replaces a table another wrote
            except FileExistsError:
                pass
            finally:
                partial.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]  # kombu's own signature
        # Consumers take files in name order: nanoseconds (kombu: milliseconds, then a random
        # uuid) keep messages sent within one millisecond in the order they were sent.
        name = f"{time.monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # not ".msg": the consumer's listing skips it
        with open(partial, "wb") as f:
            f.write(dumps(payload).encode())
        os.replace(partial, final)


class AtomicFilesystemTransport(filesystem.Transport):
    """The ``filesystem://`` transport with :class:`AtomicFilesystemChannel`."""

    Channel = AtomicFilesystemChannel
