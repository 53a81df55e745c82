"""The Redis admission backend (:class:`RedisBackend`, in :mod:`.backend`) and its parts.

``backend`` the public methods, each one Lua script; ``scripts`` how the scripts (``lua/``)
are assembled and called; ``codec`` key names, arguments and replies; ``wire`` the hot path
past redis-py's command dispatch; ``loop`` the calls answered on a worker's event loop;
``grants`` the pub/sub announcements; ``redispy`` the one reach past redis-py's public API;
``urls`` which Redis a backend URL names (one server, Sentinel, a cluster) and its client.
"""

from __future__ import annotations

from .backend import RedisBackend, import_redis
from .scripts import SCRIPTS, script_source

__all__ = ["RedisBackend", "import_redis", "script_source", "SCRIPTS"]
