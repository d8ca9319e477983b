-- Chat bindings and SEQUENTIAL cursors, shared by every replica (store/bindings.py, store/cursors.py).

-- An open chat binding. The id is minted by the server (random, no caller part); the handle is never stored,
-- only its sha256. last_used is the database's clock, shared by every replica (LRU bound, idle closing).
CREATE TABLE ragsidecar_chat_bindings (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    session text NOT NULL,
    owner_id text NOT NULL,
    source text NOT NULL,
    top_k integer NOT NULL,
    declared boolean NOT NULL,
    handle_digest bytea NOT NULL,
    opened_at timestamptz NOT NULL DEFAULT now(),
    last_used timestamptz NOT NULL
);
CREATE INDEX ragsidecar_chat_bindings_last_used ON ragsidecar_chat_bindings (last_used);

-- A SEQUENTIAL cursor: key is key_of(tenant, session, target, entry); position is the next unit to give.
CREATE TABLE ragsidecar_sequential_cursors (
    tenant text NOT NULL,
    key text NOT NULL,
    position integer NOT NULL,
    last_used timestamptz NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX ragsidecar_sequential_cursors_last_used ON ragsidecar_sequential_cursors (last_used);

-- Under [store] row_level_security a transaction sees its own tenant's rows (policy ragsidecar_tenant, added at
-- start-up). The per-database bounds (least recently used cursors and bindings, idle bindings) count and delete
-- across tenants, in transactions that set ragsidecar.maintenance (store/cursors.py, across_tenants). Policies
-- are inert until row-level security is enabled on the table.
CREATE POLICY ragsidecar_maintenance ON ragsidecar_chat_bindings
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_sequential_cursors
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
