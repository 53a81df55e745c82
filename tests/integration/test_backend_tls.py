"""TLS and a password through ``flowcontrol_backend_options``, on a real ``redis-server``
that speaks only TLS (``--port 0 --tls-port P``, a CA and a server certificate made here with
``openssl``) and asks for a password: the hot path, the scripts and the grants' pub/sub all
run over it, by ``rediss://`` and by ``redis://`` with ``ssl: True``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_flowcontrol.admission import Admitted, Grant, Ticket, backend_from_url
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.errors import BackendUnavailableError
from tests.support.services import RedisServer, need_binaries
from tests.support.waiting import wait_until

PASSWORD = "tls-s3cret"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)  # noqa: S603,S607


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """(port, CA file) of a TLS-only redis-server with a password."""
    need_binaries("Redis over TLS", "openssl")  # RedisServer asks for redis-server itself
    d = tmp_path_factory.mktemp("tls")
    ca, ca_key, cert, key = d / "ca.pem", d / "ca.key", d / "server.pem", d / "server.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=fc-test-ca",
             "-keyout", str(ca_key), "-out", str(ca))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
             "-out", str(d / "server.csr"))
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "1", "-extfile", str(d / "san.ext"), "-out", str(cert))
    server = RedisServer(d, tls=(cert, key, ca), password=PASSWORD).start(timeout=10)
    yield server.port, ca
    server.stop()


@pytest.mark.parametrize("form", ["rediss", "redis+ssl-option"])
def test_tls_and_a_password_by_options(tls_server: tuple[int, Path], key_prefix: str,
                                       form: str) -> None:
    port, ca = tls_server
    scheme, extra = ("rediss", {}) if form == "rediss" else ("redis", {"ssl": True})
    backend = backend_from_url(f"{scheme}://127.0.0.1:{port}/0",
                               {"password": PASSWORD, "ssl_ca_certs": str(ca), **extra},
                               key_prefix=key_prefix)
    heard: list[Grant] = []
    subscription = backend.subscribe_grants(heard.append)
    try:
        backend.register(QueueConfig("tls", concurrency=1))
        first = backend.try_admit(Ticket("tls", "t1", "i1"))
        assert isinstance(first, Admitted)
        assert not backend.try_admit(Ticket("tls", "t2", "i2")).admitted  # a waiter
        assert backend.release(first.slot.slot_id)  # grants the slot to t2, over TLS pub/sub
        assert wait_until(lambda: any(g.task_id == "t2" for g in heard), timeout=5)
        assert backend.stats("tls").granted == 1
    finally:
        subscription.close()
        backend.close()


def test_a_wrong_password_is_an_unreachable_backend_not_a_crash(tls_server: tuple[int, Path],
                                                               key_prefix: str) -> None:
    port, ca = tls_server
    backend = backend_from_url(f"rediss://127.0.0.1:{port}/0",
                               {"password": "wrong", "ssl_ca_certs": str(ca)}, key_prefix=key_prefix)
    try:
        with pytest.raises(BackendUnavailableError):
            backend.register(QueueConfig("tls", concurrency=1))
    finally:
        backend.close()


def test_a_certificate_signed_by_another_ca_is_refused(tls_server: tuple[int, Path],
                                                       key_prefix: str, tmp_path: Path) -> None:
    port, _ = tls_server
    other = tmp_path / "other.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other",
             "-keyout", str(tmp_path / "other.key"), "-out", str(other))
    backend = backend_from_url(f"rediss://127.0.0.1:{port}/0",
                               {"password": PASSWORD, "ssl_ca_certs": str(other)}, key_prefix=key_prefix)
    try:
        with pytest.raises(BackendUnavailableError):
            backend.register(QueueConfig("tls", concurrency=1))
    finally:
        backend.close()
