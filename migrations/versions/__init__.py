"""Alembic revision modules (alembic skips ``__init__``; it only makes them packaged)."""
