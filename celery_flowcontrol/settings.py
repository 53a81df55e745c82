"""The ``flowcontrol_*`` settings, read once per app into a frozen :class:`FlowControlSettings`.

Every setting is optional; a value of ``None`` means "use the default"::

    setting                         default                          meaning
    flowcontrol_queues              ()                               list of QueueConfig or dicts
    flowcontrol_backend_url         "memory://"                      memory://, redis://, rediss://, unix://,
                                                                     sentinel://h:26379;sentinel://h2:26379/0,
                                                                     redis+cluster://h1:7000,h2:7001 (rediss+)
    flowcontrol_backend_options     None                             dict: master_name, sentinel_kwargs, password,
                                                                     ssl options... (admission/redis/urls.py)
    flowcontrol_backend             None                             a ready backend, or a zero-argument
                                                                     callable building one; wins over the URL
    flowcontrol_parking_url         "sqlite:///flowcontrol.sqlite3"  any SQLAlchemy URL
    flowcontrol_key_prefix          "fc"                             [A-Za-z0-9_.-]{1,32}, starts Redis keys
    flowcontrol_instance_ttl        30 s                             a worker's heartbeat lifetime
    flowcontrol_waiter_ttl          600 s                            waiter pruned after this without a re-check
    flowcontrol_grant_ttl           120 s                            an unconfirmed grant passes on after this
    flowcontrol_poll_interval       1 s                              period of each worker's wake poller
    flowcontrol_linger              0.5 s                            a denied message lingers this long, unacked,
                                                                     for its grant before it is parked; 0: never
    flowcontrol_reclaim_interval    15 s                             period of beat's flowcontrol.reclaim
    flowcontrol_wake_due_interval   5 s                              period of beat's flowcontrol.wake_due
    flowcontrol_autoscale           None                             dict for the AdaptiveAutoscaler, kept raw
    flowcontrol_dashboard_token     None                             token the dashboard asks for changes
    flowcontrol_backend_connection_max_retries
                                    100                              retries of an unreachable backend at a
                                                                     worker's startup (0: for ever, as Celery's
                                                                     broker_connection_max_retries)
    flowcontrol_unknown_queues      "warn"                           a flow_queue no config names, at publish:
                                                                     "warn" (once per name), "error", "ignore"
    flowcontrol_track_parked        False                            a parked task's result-backend state is
                                                                     PARKED (as task_track_started's STARTED)
    flowcontrol_bulk_drain          False                            a flooded queue's backlog taken off a Redis
                                                                     broker in bulk (worker/drain.py): faster,
                                                                     arrival order within a line approximate

Two relations are checked as well: each queue's ``retry`` is shorter than ``waiter_ttl`` (else a
waiter is pruned before it re-checks), and ``poll_interval`` is shorter than ``grant_ttl`` (else a
grant lapses before the poller wakes its waiter).

Durations take every form :func:`~celery_flowcontrol.config.parse_duration` does (``30``, ``"2m"``).
Upper-case keys (``FLOWCONTROL_GRANT_TTL``) and Celery namespaces (``CELERY_FLOWCONTROL_...`` with
``config_from_object(..., namespace="CELERY")``) are read too; a lower-case key wins over its
upper-case twin. An unknown ``flowcontrol_*`` key is an error, since it is almost always a typo.
Every error names the setting as the configuration spells it (``CELERY_FLOWCONTROL_QUEUE``), and
a typo's hint is spelled the same way.

This module imports nothing from Celery: ``get_settings`` takes any object with a ``conf`` mapping.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from celery_flowcontrol.config import QueueConfig, parse_duration, parse_queues, unknown_key_detail
from celery_flowcontrol.errors import FlowControlConfigError

__all__ = ["BACKEND_SCHEMES", "DEFAULT_PARKING_URL", "UNKNOWN_QUEUE_POLICIES", "FlowControlSettings",
           "get_settings", "read_settings", "spelling"]

PREFIX = "flowcontrol_"
#: A SQLite file in the working directory of each process that uses it.
DEFAULT_PARKING_URL = "sqlite:///flowcontrol.sqlite3"
BACKEND_SCHEMES = ("memory", "redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster")
#: Schemes whose URL lists several hosts: their parts are checked when the backend is built.
_MULTI_HOST = ("sentinel", "redis+cluster", "rediss+cluster")
# The prefix starts every Redis key ("fc:{emails}:holders"): braces would break the hash tag,
# a colon the key layout.
KEY_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # a scheme, as SQLAlchemy's make_url needs
UNKNOWN_QUEUE_POLICIES = ("warn", "error", "ignore")
_DURATIONS = ("instance_ttl", "waiter_ttl", "grant_ttl", "poll_interval", "reclaim_interval", "wake_due_interval")


def _fail(name: str, detail: str) -> FlowControlConfigError:
    """The error for setting ``flowcontrol_<name>``."""
    return FlowControlConfigError(detail, None, PREFIX + name)


@dataclass(frozen=True)
class FlowControlSettings:
    """All ``flowcontrol_*`` settings of one app, normalised and validated in ``__post_init__``.

    Build it with :func:`get_settings` (from an app) or :meth:`from_mapping` (from a dict of
    ``flowcontrol_*`` keys); the constructor takes the same values under their short names.
    """

    queues: tuple[QueueConfig, ...] = ()
    backend_url: str = "memory://"
    backend: Any = None
    backend_options: dict[str, Any] | None = None
    parking_url: str = DEFAULT_PARKING_URL
    key_prefix: str = "fc"
    instance_ttl: float = 30.0
    waiter_ttl: float = 600.0
    grant_ttl: float = 120.0
    poll_interval: float = 1.0
    linger: float = 0.5
    reclaim_interval: float = 15.0
    wake_due_interval: float = 5.0
    autoscale: dict[str, Any] | None = None
    dashboard_token: str | None = None
    unknown_queues: str = "warn"
    backend_connection_max_retries: int = 100
    track_parked: bool = False
    bulk_drain: bool = False

    def __post_init__(self) -> None:
        def store(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        store("queues", tuple(parse_queues(self.queues, field=PREFIX + "queues").values()))
        store("backend_url", self._check_url("backend_url", self.backend_url, BACKEND_SCHEMES))
        store("parking_url", self._check_url("parking_url", self.parking_url, None))
        if isinstance(self.backend, (str, bytes, int, float, Mapping, list, tuple, set)):
            raise _fail(
                "backend",
                "must be an admission backend or a zero-argument callable that builds one "
                f"(a URL goes in {PREFIX}backend_url), got {self.backend!r}",
            )
        if self.backend_options is not None:
            if not isinstance(self.backend_options, Mapping) or not all(
                    isinstance(k, str) for k in self.backend_options):
                raise _fail("backend_options", "must be a dict such as {'master_name': 'mymaster'}, "
                            f"got {self.backend_options!r}")
            store("backend_options", dict(self.backend_options))  # a copy, as autoscale's
        if not isinstance(self.key_prefix, str) or not KEY_PREFIX_RE.fullmatch(self.key_prefix):
            raise _fail("key_prefix", f"must match [A-Za-z0-9_.-]{{1,32}}, got {self.key_prefix!r}")
        for name in _DURATIONS:
            store(name, parse_duration(getattr(self, name), field=PREFIX + name))
        # 0 turns lingering off (worker/linger.py); anything else is a duration.
        linger = self.linger
        store("linger", 0.0 if linger == 0 and not isinstance(linger, bool)
              else parse_duration(linger, field=PREFIX + "linger"))
        if self.autoscale is not None:
            if not isinstance(self.autoscale, Mapping):
                raise _fail("autoscale", f"must be a dict such as {{'min': 2, 'max': 8}}, got {self.autoscale!r}")
            store("autoscale", dict(self.autoscale))  # a copy: the caller's dict may change later
        if self.dashboard_token is not None and (not isinstance(self.dashboard_token, str) or not self.dashboard_token):
            raise _fail("dashboard_token", f"must be a non-empty string, got {self.dashboard_token!r}")
        retries = self.backend_connection_max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise _fail("backend_connection_max_retries",
                        f"must be an int >= 0 (0: retry for ever), got {retries!r}")
        if not isinstance(self.track_parked, bool):
            raise _fail("track_parked", f"must be True or False, got {self.track_parked!r}")
        if not isinstance(self.bulk_drain, bool):
            raise _fail("bulk_drain", f"must be True or False, got {self.bulk_drain!r}")
        if self.unknown_queues not in UNKNOWN_QUEUE_POLICIES:
            raise _fail("unknown_queues", f"must be one of {', '.join(map(repr, UNKNOWN_QUEUE_POLICIES))}, "
                        f"got {self.unknown_queues!r}")
        self._check_relations()

    @staticmethod
    def _check_url(name: str, url: object, schemes: tuple[str, ...] | None) -> str:
        """Return *url* if it is a string with a scheme (one of *schemes* if given) and a valid port."""
        allowed = f"a URL with scheme {', '.join(s + '://' for s in schemes)}" if schemes else "a URL"
        if not isinstance(url, str) or not _URL_RE.match(url):
            raise _fail(name, f"must be {allowed}, got {url!r}")
        parts = urlsplit(url)
        if schemes and parts.scheme.lower() not in schemes:
            raise _fail(name, f"must be {allowed}, got {url!r}")
        if parts.scheme.lower() in _MULTI_HOST:
            return url  # "h1:7000,h2:7001" is no one port: admission/redis/urls.py checks it
        try:
            parts.port  # noqa: B018 - urlsplit checks the port lazily, on access
        except ValueError:
            raise _fail(name, f"has an invalid port, got {url!r}") from None
        return url

    def _check_relations(self) -> None:
        """Reject combinations that make the machinery defeat itself."""
        for config in self.queues:
            # A waiter re-checks every `retry` seconds; pruned first, it would lose its place each time.
            if config.retry >= self.waiter_ttl:
                raise FlowControlConfigError(
                    f"must be shorter than {PREFIX}waiter_ttl ({self.waiter_ttl:g} s) or waiters are "
                    f"pruned before they re-check, got {config.retry:g} s",
                    config.name,
                    "retry",
                )
        # A woken waiter may only learn of its grant at the next poll; the grant must outlive that.
        if self.poll_interval >= self.grant_ttl:
            raise _fail(
                "poll_interval",
                f"must be shorter than {PREFIX}grant_ttl ({self.grant_ttl:g} s) or grants lapse "
                f"before the poller wakes their waiter, got {self.poll_interval:g} s",
            )

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any],
                     written: Mapping[str, str] | None = None) -> FlowControlSettings:
        """Build settings from ``flowcontrol_*`` keys (any case); other keys are ignored.

        *written* maps a key of *mapping* to the key as the configuration spells it (with a
        namespace's prefix, ``CELERY_FLOWCONTROL_QUEUES``): errors name that one."""
        names = {PREFIX + f.name: f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        spelled: dict[str, str] = {}  # field -> the key that gave it, as written
        # Lower-case keys last, so that Celery's new-style lower-case setting wins over its twin.
        for key in sorted((k for k in mapping if isinstance(k, str)), key=lambda k: k == k.lower()):
            setting = key.lower()
            if not setting.startswith(PREFIX):
                continue
            as_written = (written or {}).get(key, key)
            if setting not in names:
                spell = spelling(as_written)
                raise FlowControlConfigError(
                    unknown_key_detail(spell(setting), [spell(n) for n in names]), None, as_written)
            if mapping[key] is not None:
                kwargs[names[setting]] = mapping[key]
                spelled[names[setting]] = as_written
        try:
            return cls(**kwargs)
        except FlowControlConfigError as exc:
            raise _respelled(exc, spelled) from None


def spelling(written: str) -> Callable[[str], str]:
    """How *written* (a setting's key as a configuration spells it) spells setting names: with
    its namespace prefix (``CELERY_``) and in its case. ``spelling("CELERY_FLOWCONTROL_QUEUE")
    ("flowcontrol_queues") == "CELERY_FLOWCONTROL_QUEUES"``."""
    at = written.lower().find(PREFIX)
    head, tail = (written[:at], written[at:]) if at >= 0 else ("", written)
    upper = tail.isupper()
    return lambda name: head + (name.upper() if upper else name)


def _respelled(exc: FlowControlConfigError, spelled: Mapping[str, str]) -> FlowControlConfigError:
    """*exc* naming settings as the configuration wrote them (it was raised with lower-case names)."""
    field = exc.field
    style = None
    if exc.queue is None and field and field.startswith(PREFIX):
        base = re.match(r"[a-z0-9_]+", field)
        name = base.group(0)[len(PREFIX):] if base else ""
        if name in spelled:
            style = spelling(spelled[name])
            field = spelled[name] + field[len(PREFIX + name):]
    elif "queues" in spelled:
        style = spelling(spelled["queues"])
    if style is None or (field == exc.field and style(PREFIX) == PREFIX):
        return exc
    detail = re.sub(PREFIX + r"[a-z0-9_]+", lambda m: style(m.group(0)), exc.detail)
    return FlowControlConfigError(detail, exc.queue, field)


_cache: weakref.WeakKeyDictionary[Any, FlowControlSettings] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def _flowcontrol_items(conf: Mapping[str, Any], namespace: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``flowcontrol_*`` entries of a Celery config, with the app's config namespace
    stripped, and each one's key as written."""
    # Celery keeps namespaced keys as given ("CELERY_FLOWCONTROL_QUEUES" for namespace="CELERY").
    # The app's namespace is used, not conf.prefix, which is unset until the config is finalised.
    strip = namespace.lower().rstrip("_") + "_" if namespace else ""
    items, written = {}, {}
    for key in list(conf.keys()):
        if not isinstance(key, str):
            continue
        name = key[len(strip) :] if strip and key.lower().startswith(strip) else key
        if name.lower().startswith(PREFIX):
            items[name] = conf[key]
            written[name] = key
    return items, written


def read_settings(app: Any) -> FlowControlSettings:
    """The settings of *app* as its ``conf`` holds them now, read afresh (not cached)."""
    return FlowControlSettings.from_mapping(*_flowcontrol_items(app.conf, getattr(app, "namespace", None)))


def get_settings(app: Any) -> FlowControlSettings:
    """The settings of *app* (anything with a ``conf`` mapping), read from it once and cached.

    Later changes to ``app.conf`` are not seen: settings are read at boot, like Celery's own.
    """
    settings = _cache.get(app)
    if settings is None:
        # Built outside the lock: reading app.conf may run the user's on_configure handlers.
        built = read_settings(app)
        with _cache_lock:
            settings = _cache.setdefault(app, built)
    return settings
