"""What operators see: read models shared by the CLI, the dashboard and the metrics.

Every function reads through a :class:`~celery_flowcontrol.FlowControl` facade (its admission
backend and parking store), so it shows whatever installation the app's settings point at.
This is the one layer of the operators that touches the engines; ``cli/``, ``dashboard/`` and
``metrics.py`` go through it, and the dashboard and the metrics never through the CLI.

- :mod:`.queues`: one row per flow queue (:class:`~.queues.QueueRow`);
- :mod:`.slot_rows`: busy slots and their ids; :mod:`.waiters`: the line, in serving order;
- :mod:`.parked`: parked messages, without their bodies;
- :mod:`.changes`: the operator actions (release a slot, override capacity or max hold);
- :mod:`.workers`: the ``flowcontrol_stats`` figures of every worker that answers;
- :mod:`.schema`: create or upgrade the parking tables;
- :mod:`.clock`: the backend's clock; :mod:`.text`: durations, instants and caps as text.

Nothing is imported here, so each verb pays only for the views it reads.
"""
