-- The embedding cache shared by every replica (store/embeddings.py): (model fingerprint, chunk content hash)
-- -> the vector's little-endian float32 bytes (an exact round trip, whatever the model's dimensions).
-- tenant is '' for rows every tenant shares, or the tenant whose text it is ([store] share_embeddings = "tenant").
CREATE TABLE ragsidecar_embeddings (
    tenant text NOT NULL,
    model text NOT NULL,
    content_hash text NOT NULL,
    vector bytea NOT NULL,
    last_used timestamptz NOT NULL,
    PRIMARY KEY (tenant, model, content_hash)
);
CREATE INDEX ragsidecar_embeddings_last_used ON ragsidecar_embeddings (last_used);

-- Under [store] row_level_security: rows shared by every tenant are every tenant's; pruning (across tenants)
-- sets ragsidecar.maintenance, as in 0003.
CREATE POLICY ragsidecar_shared ON ragsidecar_embeddings USING (tenant = '');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_embeddings
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
