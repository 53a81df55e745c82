"""flowcontrol_* settings: defaults, accepted forms, read-once caching on a real Celery app, rejections."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from typing import Any

import celery
import pytest

from celery_flowcontrol.config import QueueConfig, RateLimit
from celery_flowcontrol.errors import FlowControlConfigError
from celery_flowcontrol.settings import FlowControlSettings, get_settings


def make_app(**conf: Any) -> celery.Celery:
    """A real, unconfigured Celery app (pure: no broker is contacted) with *conf* set."""
    app = celery.Celery("t", set_as_current=False)
    app.conf.update(conf)
    return app


DEFAULTS = {
    "queues": (),
    "backend_url": "memory://",
    "backend": None,
    "backend_options": None,
    "parking_url": "sqlite:///flowcontrol.sqlite3",
    "key_prefix": "fc",
    "instance_ttl": 30.0,
    "waiter_ttl": 600.0,
    "grant_ttl": 120.0,
    "poll_interval": 1.0,
    "linger": 0.5,
    "reclaim_interval": 15.0,
    "wake_due_interval": 5.0,
    "autoscale": None,
    "dashboard_token": None,
    "unknown_queues": "warn",
    "backend_connection_max_retries": 100,
    "track_parked": False,
    "bulk_drain": False,
}


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_bulk_drain_takes_only_a_bool(value: object) -> None:
    with pytest.raises(FlowControlConfigError, match="bulk_drain"):
        FlowControlSettings.from_mapping({"flowcontrol_bulk_drain": value})


def test_defaults_of_an_app_without_flowcontrol_settings() -> None:
    settings = get_settings(make_app())
    assert dataclasses.asdict(settings) == DEFAULTS
    assert settings == FlowControlSettings() == FlowControlSettings.from_mapping({})


def test_get_settings_reads_app_conf_once_and_caches_per_app() -> None:
    app = make_app(flowcontrol_key_prefix="first", flowcontrol_queues=[{"name": "emails", "concurrency": 2}])
    settings = get_settings(app)
    app.conf.flowcontrol_key_prefix = "second"
    app.conf.flowcontrol_queues = []
    assert get_settings(app) is settings
    assert settings.key_prefix == "first" and settings.queues == (QueueConfig("emails", concurrency=2),)
    other = make_app(flowcontrol_key_prefix="second")
    assert get_settings(other).key_prefix == "second"  # one cache entry per app, not one global


def test_a_rejected_config_is_not_cached() -> None:
    app = make_app(flowcontrol_grant_ttl=0)
    with pytest.raises(FlowControlConfigError):
        get_settings(app)
    app.conf.flowcontrol_grant_ttl = "2m"
    assert get_settings(app).grant_ttl == 120.0


def test_every_setting_is_read_and_normalised() -> None:
    def make_backend() -> object:
        return object()

    autoscale = {"min": 2, "max": 8}
    app = make_app(
        flowcontrol_queues=[QueueConfig("a"), {"name": "b", "rate_limit": "10/s"}],
        flowcontrol_backend_url="redis://127.0.0.1:6379/0",
        flowcontrol_backend=make_backend,
        flowcontrol_parking_url="postgresql+psycopg://postgres@127.0.0.1:5432/test",
        flowcontrol_key_prefix="My_App.v2-x",
        flowcontrol_instance_ttl="45s",
        flowcontrol_waiter_ttl="1h",
        flowcontrol_grant_ttl=90,
        flowcontrol_poll_interval="250ms",
        flowcontrol_reclaim_interval=7.5,
        flowcontrol_wake_due_interval="1m",
        flowcontrol_autoscale=autoscale,
        flowcontrol_dashboard_token="s3cret",
        broker_url="memory://",  # not ours: ignored
    )
    settings = get_settings(app)
    assert [q.name for q in settings.queues] == ["a", "b"] and settings.queues[1].rate_limit == RateLimit(
        10, 1.0
    )
    assert settings.backend is make_backend
    assert (settings.instance_ttl, settings.waiter_ttl, settings.grant_ttl) == (45.0, 3600.0, 90.0)
    assert (settings.poll_interval, settings.reclaim_interval, settings.wake_due_interval) == (
        0.25,
        7.5,
        60.0,
    )
    assert settings.key_prefix == "My_App.v2-x" and settings.dashboard_token == "s3cret"
    autoscale["max"] = 99
    assert settings.autoscale == {"min": 2, "max": 8}  # kept raw, but copied


@pytest.mark.parametrize(
    "url",
    ["memory://", "redis://localhost", "redis://:pw@h:6380/2", "rediss://h:6379/0", "unix:///tmp/redis.sock"],
)
def test_backend_url_schemes(url: str) -> None:
    assert FlowControlSettings.from_mapping({"flowcontrol_backend_url": url}).backend_url == url


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///flowcontrol.sqlite3",
        "sqlite://",
        "postgresql+psycopg://u:p@h:5432/db",
        "mysql+pymysql://h/db",
    ],
)
def test_parking_url_is_any_sqlalchemy_url(url: str) -> None:
    assert FlowControlSettings.from_mapping({"flowcontrol_parking_url": url}).parking_url == url


@pytest.mark.parametrize(
    "backend", [object(), lambda: object(), dict.fromkeys], ids=["object", "lambda", "builtin"]
)
def test_backend_may_be_an_object_or_a_callable(backend: object) -> None:
    assert FlowControlSettings(backend=backend).backend is backend


def test_none_means_default_and_lower_case_wins_over_upper_case() -> None:
    conf: dict[Any, Any] = {
        "flowcontrol_grant_ttl": None,
        "FLOWCONTROL_WAITER_TTL": "2m",
        "FLOWCONTROL_KEY_PREFIX": "up",
        "flowcontrol_key_prefix": "low",
        "unrelated": 1,
        3: "a non-str key is not ours either",
    }
    settings = FlowControlSettings.from_mapping(conf)
    assert (settings.grant_ttl, settings.waiter_ttl, settings.key_prefix) == (120.0, 120.0, "low")


@pytest.fixture
def namespaced_config() -> Iterator[str]:
    """A config module in Django style: every key under the CELERY_ namespace."""
    module = types.ModuleType("flowcontrol_test_celeryconfig")
    module.CELERY_FLOWCONTROL_GRANT_TTL = "3m"  # type: ignore[attr-defined]
    module.CELERY_FLOWCONTROL_QUEUES = [{"name": "emails"}]  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


def test_settings_under_a_celery_namespace_are_read(namespaced_config: str) -> None:
    app = celery.Celery("t", set_as_current=False)
    app.config_from_object(namespaced_config, namespace="CELERY")
    settings = get_settings(app)
    assert settings.grant_ttl == 180.0 and [q.name for q in settings.queues] == ["emails"]


# (setting without its flowcontrol_ prefix, bad value, what the message must show, test id)
SETTING_REJECTIONS: list[tuple[str, object, str, str]] = [
    ("backend_url", "http://h", "'http://h'", "url-scheme"),
    ("backend_url", "localhost:6379", "'localhost:6379'", "url-no-scheme"),
    ("backend_url", "redis://h:99999", "invalid port", "url-bad-port"),
    ("backend_url", 6379, "got 6379", "url-not-str"),
    ("parking_url", "flowcontrol.sqlite3", "'flowcontrol.sqlite3'", "parking-no-scheme"),
    ("parking_url", "", "got ''", "parking-empty"),
    ("key_prefix", "a:b", "'a:b'", "prefix-colon"),
    ("key_prefix", "{fc}", "'{fc}'", "prefix-braces"),
    ("key_prefix", "a b", "'a b'", "prefix-space"),
    ("key_prefix", "", "got ''", "prefix-empty"),
    ("key_prefix", "x" * 33, "x" * 33, "prefix-over-32"),
    ("key_prefix", 7, "got 7", "prefix-not-str"),
    ("instance_ttl", 0, "got 0", "instance-ttl-zero"),
    ("waiter_ttl", -1, "got -1", "waiter-ttl-negative"),
    ("grant_ttl", "soon", "'soon'", "grant-ttl-garbage"),
    ("poll_interval", True, "got True", "poll-interval-bool"),
    ("reclaim_interval", "0s", "'0s'", "reclaim-interval-zero"),
    ("wake_due_interval", [5], "[5]", "wake-due-interval-list"),
    ("backend", "redis://h", "flowcontrol_backend_url", "backend-url-string"),
    ("backend", 5, "got 5", "backend-number"),
    ("backend", {"url": "redis://"}, "'url'", "backend-dict"),
    ("autoscale", "2,8", "'2,8'", "autoscale-str"),
    ("dashboard_token", "", "got ''", "token-empty"),
    ("dashboard_token", 123, "got 123", "token-not-str"),
    ("queues", {"name": "a"}, "must be a list", "queues-dict"),
]
# (whole config, queue named, field named, what the message must show)
COMBINED_REJECTIONS = [
    pytest.param(
        {"flowcontrol_queues": ["a"]}, None, "flowcontrol_queues[0]", "got 'a'", id="queues-entry-str"
    ),
    pytest.param(
        {"flowcontrol_queues": [{"name": "a"}, {"name": "a"}]},
        "a",
        "name",
        "entries 0 and 1",
        id="queues-duplicate",
    ),
    pytest.param(
        {"flowcontrol_queues": [{"name": "a", "order": "x"}]}, "a", "order", "'x'", id="queues-invalid"
    ),
    pytest.param(
        {"flowcontrol_queues": [{"name": "a", "retry": "10m"}], "flowcontrol_waiter_ttl": "10m"},
        "a",
        "retry",
        "flowcontrol_waiter_ttl (600 s)",
        id="retry-not-below-waiter-ttl",
    ),
    pytest.param(
        {"flowcontrol_poll_interval": 5, "flowcontrol_grant_ttl": 5},
        None,
        "flowcontrol_poll_interval",
        "flowcontrol_grant_ttl (5 s)",
        id="poll-interval-not-below-grant-ttl",
    ),
    pytest.param(
        {"flowcontrol_grantttl": 5},
        None,
        "flowcontrol_grantttl",
        "did you mean 'flowcontrol_grant_ttl'",
        id="typo",
    ),
    *(
        pytest.param({"flowcontrol_" + name: value}, None, "flowcontrol_" + name, given, id=test_id)
        for name, value, given, test_id in SETTING_REJECTIONS
    ),
]


@pytest.mark.parametrize("via", ["get_settings", "from_mapping"])
@pytest.mark.parametrize(("conf", "queue", "field", "given"), COMBINED_REJECTIONS)
def test_each_invalid_setting_is_rejected_naming_it(
    via: str, conf: dict[str, Any], queue: str | None, field: str, given: str
) -> None:
    with pytest.raises(FlowControlConfigError) as caught:
        if via == "get_settings":
            get_settings(make_app(**conf))
        else:
            FlowControlSettings.from_mapping(conf)
    assert (caught.value.queue, caught.value.field) == (queue, field)
    assert f"field {field!r}" in str(caught.value) and given in str(caught.value)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        FlowControlSettings().grant_ttl = 1.0  # type: ignore[misc]


def test_linger_is_read_under_its_name_and_hold_is_an_unknown_setting() -> None:
    assert get_settings(make_app(flowcontrol_linger="2s")).linger == 2.0
    assert get_settings(make_app(FLOWCONTROL_LINGER="1s")).linger == 1.0
    # "hold" is what a busy slot's task does; lingering has one name only.
    for name in ("flowcontrol_hold", "FLOWCONTROL_HOLD"):
        with pytest.raises(FlowControlConfigError) as info:
            get_settings(make_app(**{name: 0}))
        assert info.value.field == name and "unknown key" in str(info.value)
    with pytest.raises(FlowControlConfigError) as info:
        get_settings(make_app(flowcontrol_linger="soon"))
    assert info.value.field == "flowcontrol_linger"
