-- The store's base: pgvector, and the table that records which migrations ran.
-- CREATE EXTENSION needs a role allowed to create it; where the sidecar's role is not, an administrator runs
-- `CREATE EXTENSION vector` once in this database beforehand (IF NOT EXISTS then needs no privilege).
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE IF NOT EXISTS ragsidecar_schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL
);
