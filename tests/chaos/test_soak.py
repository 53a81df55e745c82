"""The soak benchmark's quick profile (benchmarks/soak.py --quick): 2 minutes of steady mixed
load on 3 prefork nodes, then: no lost task, no cap exceeded, no slot leaked, RSS flat."""

from __future__ import annotations

import pytest


@pytest.mark.timeout(330)
def test_soak_quick_profile() -> None:
    from benchmarks import soak

    ok = soak.main(quick=True)
    print("chaos soak-quick:", "; ".join(f"{r.figure}={r.measured:g}" for r in soak.ROWS))
    assert ok, [r for r in soak.ROWS if not r.ok]
