"""Who may change things on the dashboard: the token, the unlocked session, and CSRF.

* No token configured (neither ``--token`` nor ``flowcontrol_dashboard_token``): read-only;
  every change is refused, and every page says so.
* With a token, a browser unlocks its session by typing it once (``POST /unlock``); the signed
  session cookie (HttpOnly, SameSite=Strict, secret per dashboard process) then remembers a
  fingerprint of the token. Scripts send ``Authorization: Bearer <token>`` instead.
* Every form carries the session's CSRF token (synchronizer pattern), compared in constant time;
  a bearer request needs none (browsers never add that header on their own).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

__all__ = ["Guard", "Refused"]

CSRF_KEY = "csrf"
UNLOCK_KEY = "unlocked"


class Refused(Exception):
    """A change that is not allowed; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Guard:
    """Checks changes against *token* (``None``: read-only dashboard)."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self._fingerprint = None if self.token is None else hashlib.sha256(
            b"flowcontrol-dashboard:" + self.token.encode()).hexdigest()

    @property
    def read_only(self) -> bool:
        """True when no token is configured: nothing can be changed."""
        return self.token is None

    def csrf_token(self, session: Any) -> str:
        """The session's CSRF token (made on first use)."""
        value = session.get(CSRF_KEY)
        if not isinstance(value, str):
            value = secrets.token_urlsafe(32)
            session[CSRF_KEY] = value
        return value

    def unlocked(self, session: Any, headers: Any = None) -> bool:
        """True when this session (or this request's bearer header) holds the token."""
        if self.token is None:
            return False
        if headers is not None and self._bearer_ok(headers):
            return True
        value = session.get(UNLOCK_KEY)
        return isinstance(value, str) and hmac.compare_digest(value, self._fingerprint or "")

    def unlock(self, session: Any, form: Any) -> None:
        """Unlock the session with the typed token; :class:`Refused` if it is wrong."""
        if self.token is None:
            raise Refused("this dashboard is read-only: start it with --token (or set "
                          "flowcontrol_dashboard_token) to allow changes")
        self.check_csrf(session, form)
        typed = form.get("token", "")
        if not isinstance(typed, str) or not hmac.compare_digest(typed.encode(), self.token.encode()):
            raise Refused("wrong token")
        session[UNLOCK_KEY] = self._fingerprint

    def lock(self, session: Any) -> None:
        """Forget the token in this session."""
        session.pop(UNLOCK_KEY, None)

    def check_change(self, session: Any, form: Any, headers: Any) -> None:
        """Allow a change, or raise :class:`Refused` saying why."""
        if self.token is None:
            raise Refused("this dashboard is read-only: start it with --token (or set "
                          "flowcontrol_dashboard_token) to allow changes")
        if self._bearer_ok(headers):
            return
        if not self.unlocked(session):
            raise Refused("changes need the dashboard token: unlock this session first")
        self.check_csrf(session, form)

    def check_csrf(self, session: Any, form: Any) -> None:
        """Refuse a form whose CSRF token is not this session's."""
        expected = session.get(CSRF_KEY)
        sent = form.get(CSRF_KEY)
        if not (isinstance(expected, str) and isinstance(sent, str)
                and hmac.compare_digest(expected.encode(), sent.encode())):
            raise Refused("the form's CSRF token is missing or stale: reload the page and retry", 400)

    def _bearer_ok(self, headers: Any) -> bool:
        if self.token is None:
            return False
        scheme, _, value = str(headers.get("Authorization", "")).partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                                 self.token.encode())
