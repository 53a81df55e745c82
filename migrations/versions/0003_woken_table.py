"""flowcontrol_woken: the last wake of each task id's row, kept for a while.

Revision ID: 0003_woken_table
Revises: 0002_postgres_due_index
Create Date: 2026-12-03

A message delivered again after its node died between a park's commit and its ack may meet a
row already woken and deleted; this table tells it that the woken copy is the one to run
(celery_flowcontrol/worker/park.py). Mirrors celery_flowcontrol/parking/model.py.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_woken_table"
down_revision = "0002_postgres_due_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flowcontrol_woken",
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("ticket", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("woken_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("task_id", name="pk_flowcontrol_woken"),
    )
    op.create_index("ix_flowcontrol_woken_woken_at", "flowcontrol_woken", ["woken_at"])


def downgrade() -> None:
    op.drop_index("ix_flowcontrol_woken_woken_at", table_name="flowcontrol_woken")
    op.drop_table("flowcontrol_woken")
