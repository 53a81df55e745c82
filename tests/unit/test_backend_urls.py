"""``flowcontrol_backend_url`` + ``flowcontrol_backend_options``: every form it names, every
bad input refused with a FlowControlConfigError naming the setting, before any connection.

Pure: :func:`celery_flowcontrol.admission.redis.urls.parse` imports no redis; the clients are
built (redis-py connects lazily) but never used, except where a test says so.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection

from celery_flowcontrol.admission import REDIS_SCHEMES, backend_from_url
from celery_flowcontrol.admission.redis import urls
from celery_flowcontrol.errors import FlowControlConfigError
from celery_flowcontrol.settings import BACKEND_SCHEMES, FlowControlSettings

URL, OPTIONS = "flowcontrol_backend_url", "flowcontrol_backend_options"


def test_the_three_lists_of_schemes_agree() -> None:
    assert set(REDIS_SCHEMES) == set(urls.SCHEMES) == set(BACKEND_SCHEMES) - {"memory"}


# -- the forms -------------------------------------------------------------------------------


def test_one_server_keeps_redis_pys_own_url() -> None:
    t = urls.parse("redis://:s3cret@h:6380/2?socket_timeout=3", {"client_name": "fc"})
    assert (t.kind, t.url, t.db, t.client) == (
        "server", "redis://:s3cret@h:6380/2?socket_timeout=3", 2, {"client_name": "fc"})


def test_ssl_true_turns_a_redis_url_into_rediss() -> None:
    t = urls.parse("redis://h:6379/0", {"ssl": True, "ssl_cert_reqs": "none"})
    assert t.url == "rediss://h:6379/0" and t.client == {"ssl_cert_reqs": "none"}
    client = urls.client_for(t, redis)
    assert client.connection_pool.connection_class is redis.SSLConnection


def test_a_unix_socket() -> None:
    assert urls.parse("unix:///run/redis.sock?db=3").kind == "server"


def test_sentinel_as_celery_writes_it() -> None:
    t = urls.parse("sentinel://:pw@h1:26380/1;sentinel://h2;sentinel://[::1]:26381",
                   {"master_name": "mymaster", "sentinel_kwargs": {"password": "spw"},
                    "min_other_sentinels": 1, "socket_timeout": 2})
    assert t.kind == "sentinel" and t.master_name == "mymaster" and t.db == 1
    assert t.nodes == (("h1", 26380), ("h2", 26379), ("::1", 26381))
    assert t.client == {"password": "pw", "socket_timeout": 2.0}
    assert t.sentinel_kwargs == {"password": "spw"} and t.min_other_sentinels == 1


def test_a_sentinel_client_asks_for_its_master_and_carries_tls_to_it() -> None:
    t = urls.parse("sentinel://h1:26379/4", {"master_name": "m", "ssl": True,
                                             "ssl_ca_certs": "/etc/ca.pem", "password": "pw"})
    if tuple(int(p) for p in redis.__version__.split(".")[:3]) < urls.SENTINEL_NEEDS:
        with pytest.raises(FlowControlConfigError):  # the lowest set: refused, see below
            urls.client_for(t, redis)
        return
    client = urls.client_for(t, redis)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "m"
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["db"] == 4 and pool.connection_kwargs["password"] == "pw"


def test_a_cluster_seeded_by_every_node_listed() -> None:
    t = urls.parse("redis+cluster://u:p%40ss@h1:7000,h2:7001,[::1]:7002/0", {"socket_timeout": 1})
    assert t.kind == "cluster"
    assert t.nodes == (("h1", 7000), ("h2", 7001), ("::1", 7002))
    assert t.client == {"username": "u", "password": "p@ss", "socket_timeout": 1.0}
    assert urls.parse("redis+cluster://h1").nodes == (("h1", 6379),)


def test_rediss_cluster_is_tls() -> None:
    t = urls.parse("rediss+cluster://h1:7000,h2:7001", {"ssl_cert_reqs": "required"})
    assert t.client == {"ssl_cert_reqs": "required", "ssl": True}


def test_settings_take_the_multi_host_forms_and_keep_a_copy_of_the_options() -> None:
    options = {"master_name": "mymaster"}
    s = FlowControlSettings.from_mapping({URL: "sentinel://h1:26379;sentinel://h2:26379/1",
                                          OPTIONS: options})
    options["master_name"] = "changed"
    assert s.backend_options == {"master_name": "mymaster"}
    assert FlowControlSettings(backend_url="redis+cluster://h1:7000,h2:7001").backend_options is None


# -- every bad input -------------------------------------------------------------------------

BAD_URLS = [
    ("http://h", "must use one of"),
    ("redis+cluster://", "names no host"),
    ("redis+cluster://h1:7000,h2:x", "invalid port 'x'"),
    ("redis+cluster://h1:70000", "invalid port '70000'"),
    ("redis+cluster://h1:7000,,h2:7001", "invalid host ''"),
    ("redis+cluster://h1:7000/1", "database other than 0"),
    ("redis+cluster://h1:7000/zero", "not a number"),
    ("redis+cluster://h1:7000?ssl=1", "query string"),
    ("rediss+cluster://h1:7000#x", "query string"),
    ("sentinel://h1:26379;redis://h2:6379", "every part must be sentinel://"),
    ("sentinel://h1:26379,h2:26379", "use ';sentinel://'"),
    ("sentinel://h1:26379/1;sentinel://h2:26379/2", "two databases"),
    ("sentinel://h1:abc", "invalid port"),
    ("sentinel://", "names no host"),
    ("sentinel://h1/x", "not a number"),
    ("redis://h:99999/0", "invalid port"),
    ("redis://h:0/0", "invalid port"),
    ("redis:///0", "names no host"),
    ("redis://h/db1", "not a number"),
    ("unix://", "no socket path"),
]


@pytest.mark.parametrize(("url", "says"), BAD_URLS, ids=[u for u, _ in BAD_URLS])
def test_a_bad_url_names_the_url_setting(url: str, says: str) -> None:
    options = {"master_name": "m"} if url.startswith("sentinel") else None
    with pytest.raises(FlowControlConfigError) as err:
        urls.parse(url, options)
    assert err.value.field == URL and says in str(err.value), str(err.value)


BAD_OPTIONS: list[tuple[str, Any, str]] = [
    ("redis://h", "not a dict", "must be a dict"),
    ("redis://h", {"pasword": "x"}, "did you mean 'password'"),
    ("redis://h", {"master_name": "m"}, "for a sentinel:// URL only"),
    ("redis+cluster://h:7000", {"sentinel_kwargs": {}}, "for a sentinel:// URL only"),
    ("redis://h", {"password": ""}, "non-empty string"),
    ("redis://h", {"password": 5}, "non-empty string"),
    ("redis://h", {"ssl": "yes"}, "True or False"),
    ("redis://h", {"socket_timeout": 0}, "above 0"),
    ("redis://h", {"socket_timeout": True}, "above 0"),
    ("redis://h", {"socket_connect_timeout": "2s"}, "above 0"),
    ("redis://h", {"max_connections": 0}, "at least 1"),
    ("redis://h", {"health_check_interval": -1}, "at least 0"),
    ("rediss://h", {"ssl_cert_reqs": "maybe"}, "must be one of"),
    ("redis://h", {"ssl_ca_certs": "/ca.pem"}, "need TLS"),
    ("rediss://h", {"ssl": False}, "can't turn TLS off"),
    ("rediss+cluster://h", {"ssl": False}, "can't turn TLS off"),
    ("redis+cluster://h", {"ssl_certfile": "/c.pem"}, "need TLS"),
    ("unix:///s.sock", {"ssl": True}, "unix socket"),
    ("sentinel://h", {}, "'master_name' is required"),
    ("sentinel://h", None, "'master_name' is required"),
    ("sentinel://h", {"master_name": ""}, "non-empty string"),
    ("sentinel://h", {"master_name": "m", "sentinel_kwargs": "pw"}, "dict with string keys"),
    ("sentinel://h", {"master_name": "m", "min_other_sentinels": -1}, "at least 0"),
    ("sentinel://h", {"master_name": "m", "ssl_keyfile": "/k.pem"}, "need TLS"),
]


@pytest.mark.parametrize(("url", "options", "says"), BAD_OPTIONS,
                         ids=[f"{u}-{o}" for u, o, _ in BAD_OPTIONS])
def test_a_bad_option_names_the_options_setting(url: str, options: Any, says: str) -> None:
    with pytest.raises(FlowControlConfigError) as err:
        urls.parse(url, options)
    assert err.value.field == OPTIONS and says in str(err.value), str(err.value)


@pytest.mark.parametrize("options", [["master_name"], "m", {1: "m"}])
def test_settings_refuse_options_that_are_not_a_dict(options: Any) -> None:
    with pytest.raises(FlowControlConfigError) as err:
        FlowControlSettings.from_mapping({URL: "redis://h", OPTIONS: options})
    assert err.value.field == OPTIONS


def test_memory_takes_no_options() -> None:
    with pytest.raises(FlowControlConfigError) as err:
        backend_from_url("memory://", {"password": "x"})
    assert err.value.field == OPTIONS
    backend_from_url("memory://", {}).close()


def test_an_unknown_scheme_names_the_url_setting() -> None:
    with pytest.raises(FlowControlConfigError) as err:
        backend_from_url("redis-cluster://h:7000")
    assert err.value.field == URL


def test_the_backend_refuses_a_bad_url_before_it_connects() -> None:
    # The host does not exist: any connection attempt would fail differently, and slowly.
    with pytest.raises(FlowControlConfigError) as err:
        backend_from_url("redis+cluster://nowhere.invalid:7000/3")
    assert err.value.field == URL


def test_sentinel_refuses_a_redis_py_whose_sentinel_connections_cant_subscribe() -> None:
    """redis-py 5.0.0 (the floor of setup.cfg) breaks pub/sub on Sentinel connections
    (redis/redis-py#2893): the URL is refused at boot, naming the version, not left to
    time out in the grant listener."""
    import types

    old = types.SimpleNamespace(**{**vars(redis), "__version__": "5.0.0"})
    t = urls.parse("sentinel://h1:26379", {"master_name": "m"})
    with pytest.raises(FlowControlConfigError) as err:
        urls.client_for(t, old)
    assert err.value.field == URL and "5.0.1 or newer" in str(err.value)
    fixed = types.SimpleNamespace(**{**vars(redis), "__version__": "5.0.1"})
    assert urls.client_for(t, fixed).connection_pool.service_name == "m"

