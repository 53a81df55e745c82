"""Calls that collapse: ``flow_unique`` (one call of a key at a time) and ``flow_debounce`` (a
burst of calls runs once, with the last call's arguments). docs/collapse.md says how.

``keys``: the keys and options (pure); ``claims``: who holds a key (memory or Redis);
``wiring``: an app's claims and debounce rows; ``publish``: what ``apply_async`` does with
them; ``landing``: the worker's side (a key is freed when the result lands).
"""
