"""Which Redis a ``flowcontrol_backend_url`` names, with ``flowcontrol_backend_options``.

Three forms, in Celery's own conventions where Celery has one:

``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS), ``unix://path[?db=N]``
    One server, through ``redis.Redis.from_url`` (redis-py's own URL forms, query string
    included).
``sentinel://[[user]:password@]host[:port][/db];sentinel://host2[:port][/db]``
    The master of ``options["master_name"]``, found by asking the Sentinels listed (port
    26379 by default), as Celery's broker and result backend write it: the db and the
    password of the first part that has one are the master's; the Sentinels' own password
    or TLS go in ``options["sentinel_kwargs"]``, as in Celery's ``broker_transport_options``;
    ``min_other_sentinels`` as well.
``redis+cluster://[[user]:password@]host[:port][,host2[:port]...][/0]``, ``rediss+cluster://``
    A Redis Cluster, through ``redis.cluster.RedisCluster``, seeded by every node listed.
    redis-py's own cluster URL (``RedisCluster.from_url``) takes one node, so a fleet started
    while that node is down could not connect; Celery has no cluster form. The ``+cluster``
    marks the client kind the way SQLAlchemy's ``dialect+driver`` does, and keeps plain
    ``redis://`` meaning one server everywhere. A cluster has database 0 only.

Options every form takes (``flowcontrol_backend_options``): ``username``, ``password``,
``ssl`` (TLS without the ``rediss`` scheme; on Sentinel, to the master), ``ssl_cert_reqs``
(``"required"``, ``"optional"``, ``"none"``), ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_check_hostname``, ``socket_timeout``, ``socket_connect_timeout``,
``socket_keepalive``, ``health_check_interval``, ``max_connections``, ``client_name``.
Sentinel only: ``master_name`` (required), ``sentinel_kwargs`` (a dict for the connections to
the Sentinels), ``min_other_sentinels``; and redis-py 5.0.1 or newer (:data:`SENTINEL_NEEDS`).
Anything else, a wrong type, or a URL that does not parse is a
:class:`~celery_flowcontrol.errors.FlowControlConfigError` naming the setting.

:func:`parse` is pure (no redis import), so every bad input is caught before a connection is
tried; :func:`client_for` builds the client through redis-py's public API only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from ...errors import FlowControlConfigError

__all__ = ["CLUSTER_SCHEMES", "SCHEMES", "SENTINEL_NEEDS", "SENTINEL_PORT", "RedisTarget", "client_for", "parse"]

URL_SETTING = "flowcontrol_backend_url"
OPTIONS_SETTING = "flowcontrol_backend_options"
SERVER_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = (*SERVER_SCHEMES, "sentinel", *CLUSTER_SCHEMES)
SENTINEL_PORT = 26379
REDIS_PORT = 6379
_HOST_RE = re.compile(r"\[(?P<v6>[0-9A-Fa-f:.]+)\](?::(?P<p6>[^:]*))?|(?P<host>[^:\[\]/]+)(?::(?P<port>[^:]*))?")
_CERT_REQS = ("required", "optional", "none")


def _url_error(url: str, detail: str) -> FlowControlConfigError:
    return FlowControlConfigError(f"{detail}, got {url!r}", None, URL_SETTING)


def _option_error(key: str, detail: str, value: object) -> FlowControlConfigError:
    return FlowControlConfigError(f"option {key!r} {detail}, got {value!r}", None, OPTIONS_SETTING)


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _option_error(key, "must be a non-empty string", value)
    return value


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _option_error(key, "must be True or False", value)
    return value


def _seconds(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 86400:
        raise _option_error(key, "must be a number of seconds above 0 (and below a day)", value)
    return float(value)


def _count(low: int) -> Callable[[str, object], int]:
    def check(key: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise _option_error(key, f"must be an int of at least {low}", value)
        return value
    return check


def _cert_reqs(key: str, value: object) -> str:
    if value not in _CERT_REQS:
        raise _option_error(key, f"must be one of {', '.join(map(repr, _CERT_REQS))}", value)
    return str(value)


def _mapping(key: str, value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _option_error(key, "must be a dict with string keys", value)
    return dict(value)


#: Options of the connections to Redis (every form), each with its check.
CLIENT_OPTIONS: dict[str, Callable[[str, object], Any]] = {
    "username": _text, "password": _text, "ssl": _flag, "ssl_cert_reqs": _cert_reqs,
    "ssl_ca_certs": _text, "ssl_certfile": _text, "ssl_keyfile": _text,
    "ssl_check_hostname": _flag, "socket_timeout": _seconds, "socket_connect_timeout": _seconds,
    "socket_keepalive": _flag, "health_check_interval": _count(0), "max_connections": _count(1),
    "client_name": _text,
}
#: Options of the Sentinel form only.
SENTINEL_OPTIONS: dict[str, Callable[[str, object], Any]] = {
    "master_name": _text, "sentinel_kwargs": _mapping, "min_other_sentinels": _count(0),
}


@dataclass(frozen=True)
class RedisTarget:
    """What a backend URL and its options name: one server, a Sentinel-managed master, or a
    cluster. ``nodes`` are the Sentinels or the cluster's seed nodes; ``client`` the
    keyword options of the connections to Redis."""

    kind: str  # "server", "sentinel" or "cluster"
    url: str = ""  # the server form's URL, for redis.Redis.from_url
    nodes: tuple[tuple[str, int], ...] = ()
    db: int = 0
    master_name: str | None = None
    min_other_sentinels: int = 0
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] = field(default_factory=dict)


def _hosts(url: str, netloc: str, default_port: int) -> list[tuple[str, int]]:
    """``host[:port]`` parts of a comma-separated *netloc* (IPv6 in brackets)."""
    nodes = []
    for part in netloc.split(","):
        m = _HOST_RE.fullmatch(part)
        if m is None:
            raise _url_error(url, f"has an invalid host {part!r}")
        host = m.group("v6") or m.group("host")
        port = m.group("p6") if m.group("v6") else m.group("port")
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            raise _url_error(url, f"has an invalid port {port!r}")
        nodes.append((host, int(port) if port else default_port))
    return nodes


def _credentials(userinfo: str) -> dict[str, str]:
    user, has_password, password = userinfo.partition(":")
    out = {}
    if user:
        out["username"] = unquote(user)
    if has_password and password:
        out["password"] = unquote(password)
    return out


def _db(url: str, path: str) -> int | None:
    path = path.strip("/")
    if not path:
        return None
    if not path.isdigit():
        raise _url_error(url, f"has a database {path!r} that is not a number")
    return int(path)


def _split(url: str, scheme: str) -> tuple[str, str, str]:
    """(userinfo, hosts, path) of one ``scheme://`` part; no query string or fragment."""
    rest = url[len(scheme) + 3:]
    if "?" in rest or "#" in rest:
        raise _url_error(url, f"takes no query string in its {scheme}:// form (options go in "
                         f"{OPTIONS_SETTING})")
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    if not hosts:
        raise _url_error(url, "names no host")
    return userinfo, hosts, slash + path


def _options(kind: str, options: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(client options, Sentinel options) of *options*, each checked."""
    if options is None:
        return {}, {}
    if not isinstance(options, Mapping):
        raise FlowControlConfigError(f"must be a dict, got {options!r}", None, OPTIONS_SETTING)
    client: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    allowed = {**CLIENT_OPTIONS, **(SENTINEL_OPTIONS if kind == "sentinel" else {})}
    for key, value in options.items():
        if key in SENTINEL_OPTIONS and kind != "sentinel":
            raise FlowControlConfigError(
                f"option {key!r} is for a sentinel:// URL only, got it with a {kind} URL",
                None, OPTIONS_SETTING)
        if key not in allowed:
            from ...config import unknown_key_detail

            raise FlowControlConfigError(unknown_key_detail(key, allowed), None, OPTIONS_SETTING)
        (sentinel if key in SENTINEL_OPTIONS else client)[key] = allowed[key](key, value)
    return client, sentinel


def _check_tls(url: str, client: dict[str, Any], tls: bool, tls_only: list[str]) -> None:
    if client.get("ssl") is False and tls:
        raise _option_error("ssl", "can't turn TLS off for a rediss URL", False)
    if tls_only and not (tls or client.get("ssl")):
        raise FlowControlConfigError(
            f"options {', '.join(map(repr, tls_only))} need TLS: a rediss URL or 'ssl': True, "
            f"got {url!r}", None, OPTIONS_SETTING)


def parse(url: object, options: Mapping[str, Any] | None = None) -> RedisTarget:
    """The :class:`RedisTarget` of backend URL *url* with backend *options*, checked whole.

    :raises FlowControlConfigError: naming ``flowcontrol_backend_url`` or
        ``flowcontrol_backend_options``, for any part that is wrong.
    """
    if not isinstance(url, str) or "://" not in url:
        raise FlowControlConfigError(f"must be a Redis URL, got {url!r}", None, URL_SETTING)
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        raise _url_error(url, f"must use one of {', '.join(s + '://' for s in SCHEMES)}")
    kind = "sentinel" if scheme == "sentinel" else "cluster" if scheme in CLUSTER_SCHEMES else "server"
    client, sentinel = _options(kind, options)
    tls_only = [k for k in client if k.startswith("ssl_")]
    if kind == "server":
        return _server(url, scheme, client, tls_only)
    if kind == "cluster":
        userinfo, hosts, path = _split(url, scheme)
        if _db(url, path) not in (None, 0):
            raise _url_error(url, "names a database other than 0 (a Redis Cluster has only 0)")
        _check_tls(url, client, scheme == "rediss+cluster", tls_only)
        if scheme == "rediss+cluster":
            client["ssl"] = True
        return RedisTarget("cluster", nodes=tuple(_hosts(url, hosts, REDIS_PORT)),
                           client={**_credentials(userinfo), **client})
    return _sentinel(url, client, sentinel, tls_only)


def _server(url: str, scheme: str, client: dict[str, Any], tls_only: list[str]) -> RedisTarget:
    if scheme != "unix":
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise _url_error(url, "has an invalid port") from None
        if not parts.hostname:
            raise _url_error(url, "names no host")
        if port == 0:
            raise _url_error(url, "has an invalid port")
        db = _db(url, parts.path)
    else:
        db = None
        if not urlsplit(url).path:
            raise _url_error(url, "names no socket path")
        if client.get("ssl") or tls_only:
            raise FlowControlConfigError(
                f"TLS options don't apply to a unix socket, got {sorted(client)}", None,
                OPTIONS_SETTING)
    _check_tls(url, client, scheme == "rediss", tls_only)
    if client.pop("ssl", None) and scheme == "redis":
        url = "rediss" + url[len("redis"):]  # redis-py picks TLS by the scheme, not a keyword
    return RedisTarget("server", url=url, db=db or 0, client=client)


def _sentinel(url: str, client: dict[str, Any], sentinel: dict[str, Any],
              tls_only: list[str]) -> RedisTarget:
    if "master_name" not in sentinel:
        raise FlowControlConfigError(
            f"must name the master: 'master_name' is required with a sentinel:// URL, got "
            f"{sorted(sentinel)}", None, OPTIONS_SETTING)
    nodes: list[tuple[str, int]] = []
    db: int | None = None
    credentials: dict[str, str] = {}
    for part in url.split(";"):
        part = part.strip()
        if part.partition("://")[0].lower() != "sentinel":
            raise _url_error(url, f"joins {part!r} with ';': every part must be sentinel://")
        userinfo, hosts, path = _split(part, "sentinel")
        if "," in hosts:
            raise _url_error(url, "separates Sentinels with ',': use ';sentinel://' as Celery does")
        nodes.extend(_hosts(url, hosts, SENTINEL_PORT))
        this = _db(url, path)
        if this is not None and db is not None and this != db:
            raise _url_error(url, f"names two databases, {db} and {this}")
        db = this if db is None else db
        credentials = credentials or _credentials(userinfo)
    _check_tls(url, client, False, tls_only)
    return RedisTarget("sentinel", nodes=tuple(nodes), db=db or 0,
                       master_name=sentinel["master_name"],
                       min_other_sentinels=sentinel.get("min_other_sentinels", 0),
                       sentinel_kwargs=sentinel.get("sentinel_kwargs", {}),
                       client={**credentials, **client})


#: The first redis-py whose Sentinel-managed connections take pub/sub (redis/redis-py#2893).
SENTINEL_NEEDS = (5, 0, 1)


def _version(redis: Any) -> tuple[int, ...]:
    parts = re.findall(r"\d+", str(getattr(redis, "__version__", "0")))[:3]
    return tuple(int(p) for p in parts)


def client_for(target: RedisTarget, redis: Any) -> Any:
    """A redis-py client of *target*; *redis* is the redis-py module (imported by the caller).

    Nothing connects here but the cluster client, which reads the slot map from a seed node.
    """
    if target.kind == "server":
        return redis.Redis.from_url(target.url, **target.client)
    if target.kind == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                            **target.client)
    from redis.sentinel import Sentinel

    if _version(redis) < SENTINEL_NEEDS:
        # redis-py 5.0.0's Sentinel-managed connections can't read a pub/sub reply (their
        # read_response lacks push_request, redis/redis-py#2893): grants could never be heard.
        raise FlowControlConfigError(
            f"needs redis-py {'.'.join(map(str, SENTINEL_NEEDS))} or newer with a sentinel:// URL "
            f"(its Sentinel connections can't subscribe before), got {redis.__version__}",
            None, URL_SETTING)
    # The connection options go to the master's connections (Sentinel passes them on);
    # sentinel_kwargs to the connections to the Sentinels themselves, as in Celery.
    sentinels = Sentinel(list(target.nodes), min_other_sentinels=target.min_other_sentinels,
                         sentinel_kwargs=target.sentinel_kwargs or None, **target.client)
    return sentinels.master_for(target.master_name, db=target.db)
