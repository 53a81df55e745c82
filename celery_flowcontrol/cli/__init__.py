"""The ``celery flowcontrol`` command line (``celery.commands`` entry point)."""

from __future__ import annotations

from . import collapsed_verb as _collapsed  # noqa: F401 - registers the `collapsed` verb
from . import dead_verb as _dead  # noqa: F401 - registers the `dead` verb on the group
from . import key_verb as _key  # noqa: F401 - registers the `key` verb on the group
from . import keys_verb as _keys  # noqa: F401 - registers the `keys` verb on the group
from . import pause_verb as _pause  # noqa: F401 - registers the `pause` verb on the group
from . import rate_verb as _rate  # noqa: F401 - registers the `rate` verb on the group
from . import resume_verb as _resume  # noqa: F401 - registers the `resume` verb on the group
from . import why_verb as _why  # noqa: F401 - registers the `why` verb on the group
from .commands import flowcontrol

__all__ = ["flowcontrol"]
