"""Storage backends behind the domain's storage ports (`knowledge/storage.py`): `embedded` (SQLite in WAL mode,
this process only) and `postgres` (PostgreSQL shared by every replica, each replica searching a local index caught
up from its change log). `factory.py` is the one place that picks a backend; psycopg is imported only when the
PostgreSQL backend is on.
"""
