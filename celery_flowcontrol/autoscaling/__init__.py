"""Pure logic of the adaptive autoscaler: the controller, its samples, gauges and the simulation.

Nothing here imports Celery; :mod:`celery_flowcontrol.autoscale` plugs it into the worker.
"""

from __future__ import annotations

from .controller import Adjustment, GradientController, TickSample, percentile
from .recorder import PipeFeed, TickRecorder

__all__ = ["Adjustment", "GradientController", "PipeFeed", "TickRecorder", "TickSample", "percentile"]
