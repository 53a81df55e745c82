"""Parking tables: flowcontrol_parked (parked messages) and flowcontrol_dead (dead letters).

Revision ID: 0001_parking_tables
Revises:
Create Date: 2025-01-01

Mirrors celery_flowcontrol/parking/model.py; tests/integration/test_parking.py checks that the
migrated schema and the model agree.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_parking_tables"
down_revision = None
branch_labels = None
depends_on = None

# SQLite auto-numbers only a column declared exactly INTEGER PRIMARY KEY.
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "flowcontrol_parked",
        sa.Column("seq", SEQ, autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("fairness_key", sa.String(256), nullable=True),
        sa.Column("wake_at", sa.Double(), nullable=False),
        sa.Column("parked_at", sa.Double(), nullable=False),
        sa.Column("claimed_until", sa.Double(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("content_type", sa.String(128), nullable=False),
        sa.Column("content_encoding", sa.String(64), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("properties", sa.Text(), nullable=False),
        sa.Column("exchange", sa.String(255), nullable=False),
        sa.Column("routing_key", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_flowcontrol_parked"),
        sa.UniqueConstraint("task_id", name="uq_flowcontrol_parked_task_id"),
        sqlite_autoincrement=True,
    )
    # Covers the claim: due rows filtered (lease) and sorted (priority, seq) from the index alone.
    op.create_index(
        "ix_flowcontrol_parked_wake_at", "flowcontrol_parked", ["wake_at", "priority", "seq", "claimed_until"]
    )
    op.create_index("ix_flowcontrol_parked_queue_wake_at", "flowcontrol_parked", ["queue", "wake_at"])
    if op.get_context().dialect.name == "postgresql":
        # The claim's order, so FOR UPDATE SKIP LOCKED ... LIMIT stops early (see model.py).
        op.create_index("ix_flowcontrol_parked_rank", "flowcontrol_parked", [sa.text("priority DESC"), "seq"])

    op.create_table(
        "flowcontrol_dead",
        sa.Column("id", SEQ, autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("priority", sa.BigInteger(), nullable=False),
        sa.Column("fairness_key", sa.Text(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("content_type", sa.Text(), nullable=False),
        sa.Column("content_encoding", sa.Text(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("properties", sa.Text(), nullable=False),
        sa.Column("exchange", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_flowcontrol_dead"),
    )
    op.create_index("ix_flowcontrol_dead_created_at", "flowcontrol_dead", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_flowcontrol_dead_created_at", table_name="flowcontrol_dead")
    op.drop_table("flowcontrol_dead")
    if op.get_context().dialect.name == "postgresql":
        op.drop_index("ix_flowcontrol_parked_rank", table_name="flowcontrol_parked")
    op.drop_index("ix_flowcontrol_parked_queue_wake_at", table_name="flowcontrol_parked")
    op.drop_index("ix_flowcontrol_parked_wake_at", table_name="flowcontrol_parked")
    op.drop_table("flowcontrol_parked")
