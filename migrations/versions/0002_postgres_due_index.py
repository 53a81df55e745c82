"""PostgreSQL: the claim's wake_at index without claimed_until, so a lease is a HOT update.

Revision ID: 0002_postgres_due_index
Revises: 0001_parking_tables
Create Date: 2026-11-30

ix_flowcontrol_parked_wake_at (wake_at, priority, seq, claimed_until) covers the claim on SQLite.
On PostgreSQL the claim locks, so reads, every row it takes anyway, and the indexed claimed_until
made each lease an update that adds an entry to every index. There it becomes
ix_flowcontrol_parked_due (wake_at), as in celery_flowcontrol/parking/model.py. Other databases
are left as they are.
"""

from __future__ import annotations

from alembic import op

revision = "0002_postgres_due_index"
down_revision = "0001_parking_tables"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.create_index("ix_flowcontrol_parked_due", "flowcontrol_parked", ["wake_at"])
    op.drop_index("ix_flowcontrol_parked_wake_at", table_name="flowcontrol_parked")


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.create_index(
        "ix_flowcontrol_parked_wake_at", "flowcontrol_parked", ["wake_at", "priority", "seq", "claimed_until"]
    )
    op.drop_index("ix_flowcontrol_parked_due", table_name="flowcontrol_parked")
