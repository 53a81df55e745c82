"""A message whose cost no admission can ever take is dead-lettered, never looped, never run.

A producer of ours refuses such a cost at publish (task.py); a foreign one (``send_task``
with a hand-made ``flow_cost`` header) can still send one: a garbage header (not a finite
number > 0: protocol.read_cost reads it as NaN) or a cost above what a ``per="cost"`` limit
of the queue admits at once. Both make admission raise ``CostRefusedError``; waiting can't
help and running would break the limit, so the gate hands the delivery to
:func:`dead_letter_cost`: the message is kept in the dead-letter table with the reason
(``celery flowcontrol dead``), taken out of its queue's line, and only then acked.

The gate calls it with its parker, which owns every dead letter (park.py, quarantine.py):
a refusal raised by its own admission call, or answered on the event loop; its tickets carry
``opts.cost`` (gate.py, asking.py).
"""

from __future__ import annotations

import logging

from ..errors import CostRefusedError, FlowControlError
from ..reasons import DeadReason
from .delivery import Delivery, Outcome
from .message import parked_of
from .park import Parker

logger = logging.getLogger(__name__)

#: The dead-letter reason of a message whose cost can never be admitted.
COST_REFUSED = DeadReason.COST_REFUSED


def dead_letter_cost(parker: Parker, d: Delivery, exc: CostRefusedError) -> Outcome:
    """Keep *d* in the dead-letter table with *exc* as the reason's details, take its ticket
    out of line, and ack it (:data:`Outcome.PARKED`: done here). A database outage leaves the
    message unacked (:data:`Outcome.DEFER`), to be decided again."""
    opts = d.opts
    queue = opts.queue if opts is not None else exc.queue or ""
    row = parked_of(d.message, task_id=d.task_id, queue=queue, task_name=str(d.task.name),
                    priority=opts.priority if opts is not None else 0,
                    key=opts.key if opts is not None else None, wake_at=parker.clock(),
                    reason=COST_REFUSED.value, now=parker.clock())
    try:
        parker.dead_letter(row, COST_REFUSED, exc)
    except FlowControlError as outage:
        logger.warning("flowcontrol: task %s (cost refused) can't be dead-lettered yet: %s",
                       d.task_id, outage)
        return Outcome.DEFER
    d.ack()
    return Outcome.PARKED


__all__ = ["COST_REFUSED", "dead_letter_cost"]
