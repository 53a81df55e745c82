"""The one place that reaches past Celery's and kombu's public API, and why.

Each function here reads something a supported Celery or kombu gives no public way to, or
gives differently from one release to the next (setup.cfg's floors to the newest), so the
modules that need it stay on public names. (redis-py's are in ``admission/redis/redispy.py``:
the admission layer imports nothing of Celery's.)

``pool_size(pool)``
    How many tasks a worker pool runs at once. Celery before 5.7 gives a gevent pool's
    *running* greenlets as ``num_processes`` (``len(self._pool)``), and its ``grow`` and
    ``shrink`` change only the size of the ``gevent.pool.Pool`` it keeps as ``_pool``: an
    autoscaler reading ``num_processes`` saw a pool of 4 as one of 0 and grew it every
    tick. gevent's ``Pool.size`` is the size on every Celery from 5.3 on.
``resized(pool)``
    After a ``grow`` or ``shrink``: Celery before 5.7 leaves a gevent pool's ``limit``, the
    ``max-concurrency`` that ``celery inspect stats`` shows, at the size it started with;
    this sets it to the size, as Celery 5.7's own ``grow`` and ``shrink`` do.
``unaccepted_jobs(pool)``
    Whether a prefork pool has written a job to a child that has not accepted it yet:
    billiard counts such a child as idle, and ``shrink`` may remove it, losing the job
    (``WorkerLostError``). billiard's pool keeps its jobs in ``_cache`` and each job's
    ``_accepted``.
``exchange_table(channel, exchange)``
    The path of a filesystem-transport exchange's binding table: kombu 5.7's
    ``Channel._exchange_file`` (which also refuses names that would leave the control
    folder), or the path kombu 5.3 to 5.6 build inline.
``publish_first``, ``pushes_first``, ``ack_together``, ``AckTogether``
    kombu's Redis transport's own keys and lists: :mod:`.kombu_redis` owns them (re-exported
    here).
``store_states(backend, states)``
    Write a custom state (``PARKED``) for several tasks. Celery's public ``store_result`` is
    one task at a time, and on a key-value backend two round trips each (it reads the state
    first, so as not to overwrite a SUCCESS). On Redis this reads every key in one ``MGET``
    and writes the rest in one pipeline (``SET``/``SETEX`` and the ``PUBLISH`` Celery's
    result consumer listens to, as ``RedisBackend.set`` does), with the meta built by the
    backend's own ``_get_result_meta``. On Celery's database backend, one transaction: the
    batch's rows read at once (locked where the database locks rows), written with the
    backend's own ``task_cls`` and ``_update_result`` (what its ``_store_result`` does per
    task, a commit each: 24 tasks a second on SQLite), one commit; should a row appear
    meanwhile (the task ended and stored its own), ``store_result`` per task instead.
    Elsewhere a read of the task's state and ``store_result`` per task. Every way, a task
    that ended meanwhile (woken and run elsewhere, revoked) keeps its ending: Celery's
    backends keep only a SUCCESS themselves.

``push_request(task, ...)``
    What a task's ``push_request`` pushes when a task class with a ``__call__`` of its own
    (:class:`~celery_flowcontrol.FlowTask`'s) calls ``Task.__call__``: a context that keeps
    the request it runs in (id, headers, what the worker handed it as ``flow_*``), with the
    call's own arguments over it, as Celery 5.5's ``Task.push_request`` does. Celery before
    5.5 pushes a bare context of the arguments alone (Celery PR #9208), so a worker's run saw no
    request (``request.id`` None, ``called_directly`` True) wherever Celery had not installed
    its worker "stack protection", which calls ``run`` without pushing: an eager ``apply``,
    and a worker made as ``WorkController`` in-process (``celery.contrib.testing``, the
    pytest plugin), unlike ``celery worker`` and its prefork children.

``confirming(producer)``, :class:`PublishRefused`
    On kombu's py-amqp transport (RabbitMQ), a producer on a channel of its own, in publisher
    confirm mode, on *producer*'s connection: each publish is ``mandatory`` and waits for the
    broker's ack, so a refusal is known, and pinned on its message, before the publish returns.
    py-amqp's connection-wide ``confirm_publish`` transport option would confirm every
    publish of the application (its own tasks, results) too; this one channel is the wake's
    alone, by binding py-amqp's ``Channel.basic_publish_confirm`` as its ``basic_publish``
    (what py-amqp itself does on a ``confirm_publish`` connection). A message the broker
    returns as unroutable (``basic.return``, sent before its ack) or nacks raises
    :class:`PublishRefused`; a publish to an exchange that does not exist closes the channel
    (``NotFound``, a channel error, raised on that publish). py-amqp then opens the channel
    again, but some py-amqp releases (5.1.1 among them) keep it marked as in confirm mode, so
    its next publish would wait for an ack the broker never sends: after a channel error the
    wake's producer takes a new channel of its own and closes that one. The wait for an ack
    is bounded by :data:`CONFIRM_TIMEOUT`: kombu before 5.5 has no ``confirm_timeout`` to pass
    on, and there py-amqp's ``basic_publish_confirm`` takes the publish's ``timeout`` for it.

``tests/unit/test_compat.py`` holds each to what its caller relies on, on the installed
Celery and kombu, so a release that changes one fails there, by name (what kombu_redis.py
reaches for, which needs a Redis, in ``tests/integration/test_kombu_redis.py`` and
``tests/integration/test_park_batch.py``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from amqp.exceptions import MessageNacked  # py-amqp: a dependency of kombu
from celery.app.task import Context
from kombu import Producer

from .kombu_redis import AckTogether, ack_together, publish_first, pushes_first

__all__ = ["CONFIRM_TIMEOUT", "AckTogether", "PublishRefused", "ack_together", "confirming", "exchange_table",
           "pool_size", "publish_first", "push_request", "pushes_first", "resized", "store_states", "unaccepted_jobs"]

#: Seconds a confirmed publish waits for the broker's ack before the connection counts as
#: lost (kombu's retry then reconnects: a late ack can't be taken for a later message's).
CONFIRM_TIMEOUT = 10.0
#: The ``Producer.publish`` argument py-amqp's confirmed publish bounds its wait by (module
#: docstring): ``confirm_timeout`` where kombu passes it on, else ``timeout``.
_CONFIRM_TIMEOUT_ARG = ("confirm_timeout" if "confirm_timeout" in inspect.signature(Producer.publish).parameters
                        else "timeout")


def _gevent_size(pool: Any) -> int | None:
    if type(pool).__module__ != "celery.concurrency.gevent":
        return None
    size = getattr(getattr(pool, "_pool", None), "size", None)
    return size if isinstance(size, int) else None


def pool_size(pool: Any) -> int:
    """How many tasks Celery worker pool *pool* runs at once (its size, not how many run)."""
    size = _gevent_size(pool)
    return int(pool.num_processes) if size is None else size


def resized(pool: Any) -> None:
    """After *pool* grew or shrank: a gevent pool's ``limit`` (its ``max-concurrency`` in
    ``inspect stats``) follows its size. Other pools are left as Celery keeps them."""
    size = _gevent_size(pool)
    if size is not None and pool.limit != size:
        pool.limit = size


def unaccepted_jobs(pool: Any) -> bool:
    """True while prefork pool *pool* has a job written to a child that hasn't accepted it."""
    cache = getattr(getattr(pool, "_pool", None), "_cache", None) or {}
    return any(not getattr(job, "_accepted", True) for job in list(cache.values()))


def exchange_table(channel: Any, exchange: str) -> Path:
    """The binding table file of *exchange* on kombu filesystem channel *channel*."""
    own = getattr(channel, "_exchange_file", None)
    if own is not None:
        return Path(own(exchange))
    return Path(channel.control_folder) / f"{exchange}.exchange"


def push_request(task: Any, *args: Any, **kwargs: Any) -> None:
    """Push a request context on *task*'s stack: the current request's fields, *kwargs* over
    them (module docstring)."""
    task.request_stack.push(Context(*args, **{**task.request.__dict__, **kwargs}))


class PublishRefused(Exception):
    """RabbitMQ refused a confirmed publish: returned it as unroutable, or nacked it. The
    message says the broker's reason."""


class _Confirming(Producer):
    """A producer whose channel is its own and in confirm mode, also after kombu's retry
    reconnects (which revives a producer with the connection's default channel)."""

    def __init__(self, connection: Any) -> None:
        self.__connection__ = connection
        self._returned: list[str] = []
        super().__init__(_confirm_channel(connection), on_return=self._on_return)

    @property
    def _connection(self) -> Any:
        return self.__connection__  # kombu's Connection this producer was made on

    def revive(self, channel: Any) -> None:  # noqa: D102  (Producer's)
        if getattr(channel, "basic_publish", None) != getattr(channel, "basic_publish_confirm", None):
            channel = _confirm_channel(self.__connection__)
        super().revive(channel)

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(f"{exc} (exchange {exchange!r}, routing key {routing_key!r})")

    def publish(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        """``Producer.publish``, mandatory and confirmed; :class:`PublishRefused` if the
        broker returned or nacked the message."""
        if not kwargs.get(_CONFIRM_TIMEOUT_ARG):
            kwargs[_CONFIRM_TIMEOUT_ARG] = CONFIRM_TIMEOUT
        kwargs["mandatory"] = True
        return super().publish(body, *args, **kwargs)

    def _publish(self, *args: Any, **kwargs: Any) -> Any:
        # Inside kombu's retry: py-amqp counts a nack as a recoverable *connection* error,
        # which the retry would answer by reconnecting and publishing again.
        self._returned.clear()
        try:
            result = super()._publish(*args, **kwargs)
        except MessageNacked:
            raise PublishRefused("nacked by the broker (basic.nack: not taken, e.g. a full "
                                 "queue with overflow reject-publish)") from None
        except self._connection.channel_errors:
            self._reopen()
            raise
        if self._returned:
            raise PublishRefused(f"returned by the broker as unroutable: {self._returned[0]}")
        return result

    def _reopen(self) -> None:
        """After a channel error: a new channel in confirm mode, the one py-amqp reopened
        closed (it may not confirm: module docstring)."""
        connection = self._connection
        old = self._channel
        self.revive(_confirm_channel(connection))
        if getattr(old, "is_open", False):
            try:
                old.close()
            except (*connection.connection_errors, *connection.channel_errors):
                pass  # the connection went: it closed its channels with it


def _confirm_channel(connection: Any) -> Any:
    channel = connection.channel()
    channel.basic_publish = channel.basic_publish_confirm
    return channel


_CONFIRMING: WeakKeyDictionary[Any, _Confirming] = WeakKeyDictionary()


def confirming(producer: Any) -> Producer | None:
    """A producer of confirmed publishes on *producer*'s connection (see above), kept with
    the connection for the next; ``None`` on any transport but py-amqp's (the Redis transport
    has no confirms: a publish is done when Redis answers its push)."""
    connection = producer.connection
    if getattr(connection.transport, "driver_type", "") != "amqp":
        return None
    own = _CONFIRMING.get(connection)
    channel = None if own is None else own._channel
    if (own is None or not getattr(channel, "is_open", False)
            or getattr(channel, "connection", None) is not connection.connection):
        own = _CONFIRMING[connection] = _Confirming(connection)
    return own


def store_states(backend: Any, state: str, metas: dict[str, dict[str, Any]]) -> None:
    """Set *state* with its meta for every task id of *metas*, skipping a task whose stored
    state is final already (module docstring)."""
    if not metas:
        return
    from celery import states as celery_states

    client: Any = getattr(backend, "client", None)
    if hasattr(backend, "ResultSession") and hasattr(backend, "_update_result"):
        if _store_states_in_one_transaction(backend, state, metas):
            return
    if not (hasattr(backend, "get_key_for_task") and hasattr(client, "pipeline")
            and hasattr(backend, "_get_result_meta")):
        for task_id, meta in metas.items():
            if backend.get_task_meta(task_id, cache=False).get("status") in celery_states.READY_STATES:
                continue  # it ended meanwhile: its ending stands
            backend.store_result(task_id, meta, state)
        return
    keys = {task_id: backend.get_key_for_task(task_id) for task_id in metas}
    stored = client.mget(list(keys.values()))
    pipe = client.pipeline()
    for (task_id, key), old in zip(keys.items(), stored, strict=True):
        if old is not None and backend.decode_result(old).get("status") in celery_states.READY_STATES:
            continue  # it ended meanwhile (woken and run elsewhere): its ending stands
        meta = backend._get_result_meta(result=metas[task_id], state=state, traceback=None,
                                        request=None)
        meta["task_id"] = task_id
        value = backend.encode(meta)
        if backend.expires:
            pipe.setex(key, backend.expires, value)
        else:
            pipe.set(key, value)
        pipe.publish(key, value)
    pipe.execute()


def _store_states_in_one_transaction(backend: Any, state: str, metas: dict[str, dict[str, Any]]) -> bool:
    """*state* for every task of *metas* in one transaction of Celery's database backend;
    False (nothing written) when a row was inserted meanwhile by someone else."""
    from celery import states as celery_states
    from sqlalchemy.exc import IntegrityError

    model = backend.task_cls
    session = backend.ResultSession()
    try:
        query = session.query(model).filter(model.task_id.in_(list(metas))).with_for_update()
        found = {row.task_id: row for row in query}
        for task_id, meta in metas.items():
            row = found.get(task_id)
            if row is None:
                row = model(task_id)
                row.task_id = task_id
                session.add(row)
            elif row.status in celery_states.READY_STATES:
                continue  # it ended meanwhile: its ending stands
            backend._update_result(row, backend.encode_result(meta, state), state)
        session.commit()
        return True
    except IntegrityError:  # a task stored its own row between the read and the commit
        session.rollback()
        return False
    finally:
        session.close()
