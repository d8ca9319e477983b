-- MEMORY and binding documents gain typed metadata, timestamps and an expiry (#31). Times are nanoseconds since
-- the Unix epoch (bigint); `expires` NULL never expires. Documents written before carry this migration's time.
ALTER TABLE ragsidecar_memory_documents
    ADD COLUMN typed jsonb NOT NULL DEFAULT '{}',      -- filters.to_json of the typed metadata
    ADD COLUMN created bigint NOT NULL DEFAULT 0,
    ADD COLUMN updated bigint NOT NULL DEFAULT 0,
    ADD COLUMN expires bigint;
UPDATE ragsidecar_memory_documents
    SET created = (extract(epoch FROM now()) * 1000000000)::bigint,
        updated = (extract(epoch FROM now()) * 1000000000)::bigint;
-- The purge finds expired documents by this index, whatever the number that never expire.
CREATE INDEX ragsidecar_memory_documents_expiring ON ragsidecar_memory_documents (expires)
    WHERE expires IS NOT NULL;

-- A chunk's meta carries its document's filterable fields ("fields", as MemoryDocument.fields writes them): the
-- string metadata (keys not starting with "$"), "$id", "$created" and "$updated".
UPDATE ragsidecar_memory_chunks c SET meta = c.meta || jsonb_build_object('fields',
        (SELECT coalesce(jsonb_object_agg(e.key, e.value) FILTER (WHERE left(e.key, 1) <> '$'), '{}'::jsonb)
            FROM jsonb_each(d.metadata) e)
        || jsonb_build_object('$id', d.id, '$created', jsonb_build_object('t', d.created),
            '$updated', jsonb_build_object('t', d.updated)))
    FROM ragsidecar_memory_spaces s, ragsidecar_memory_documents d
    WHERE s.id = c.space AND d.partition = s.partition AND d.id = c.document;
-- Indexes held or snapshotted before hold chunks without their fields: every space's log now starts after the
-- partition's latest change, so each replica loads its spaces whole once.
UPDATE ragsidecar_memory_spaces s SET log_from = p.changes + 1
    FROM ragsidecar_memory_partitions p WHERE p.id = s.partition;
