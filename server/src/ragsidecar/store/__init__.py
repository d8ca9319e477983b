"""Shared knowledge state on PostgreSQL + pgvector (`[store] backend = "postgres"`), for replicated hosts.

`database.Database` is the connection pool and its health, `migrate` the versioned schema (`migrations/`).
psycopg is an optional dependency (`pip install "ragsidecar[postgres]"`), imported only when the backend is on.
"""
