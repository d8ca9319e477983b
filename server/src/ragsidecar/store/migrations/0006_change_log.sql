-- MEMORY searches move out of SQL (store/postgres_documents.py): every replica searches a resident index of its
-- own, caught up from a change log kept here. PostgreSQL stays the source of truth for documents, chunks and
-- vectors; what searching in SQL needed goes, so writes no longer maintain it.

-- The change log. Every transaction that changes a partition's chunks locks its row, draws the next `changes`
-- and stamps the chunks it adds with it, so the sequence orders a partition's changes as they commit. The keys of
-- the chunks it removes go to ragsidecar_memory_removals with it, per space: a replica whose index is at position
-- P applies the removals after P, then adds the chunks stamped after P. A space keeps the removals after its
-- `log_from` only (at most a bounded number, `logged` counting them): an index older than that loads the space
-- whole.
ALTER TABLE ragsidecar_memory_partitions ADD COLUMN changes bigint NOT NULL DEFAULT 0;

-- `filled_at` replaces `complete_at`: the change at which the space held chunks of every document (-1: never).
ALTER TABLE ragsidecar_memory_spaces
    ADD COLUMN filled_at bigint NOT NULL DEFAULT -1,
    ADD COLUMN log_from bigint NOT NULL DEFAULT 0,
    ADD COLUMN logged bigint NOT NULL DEFAULT 0;
UPDATE ragsidecar_memory_spaces s SET filled_at = 0 FROM ragsidecar_memory_partitions p
    WHERE p.id = s.partition AND s.complete_at = p.version;
ALTER TABLE ragsidecar_memory_spaces DROP COLUMN complete_at, DROP COLUMN chunks, DROP COLUMN terms;
ALTER TABLE ragsidecar_memory_partitions DROP COLUMN version;

-- A chunk's key in its space, as store/resident.py's chunk_keys makes it: identifiers.key_of(document, ordinal
-- within the document), the sha256 of each part's UTF-8 length (8 bytes, big-endian) and bytes. Existing chunks
-- were inserted in their documents' order, so their ids number them.
ALTER TABLE ragsidecar_memory_chunks ADD COLUMN change bigint NOT NULL DEFAULT 0, ADD COLUMN key text;
UPDATE ragsidecar_memory_chunks c SET key = encode(sha256(
        int8send(octet_length(convert_to(n.document, 'UTF8'))::bigint) || convert_to(n.document, 'UTF8')
        || int8send(octet_length(n.ordinal)::bigint) || convert_to(n.ordinal, 'UTF8')), 'hex')
    FROM (SELECT id, document, (row_number() OVER (PARTITION BY space, document ORDER BY id) - 1)::text AS ordinal
          FROM ragsidecar_memory_chunks) n
    WHERE n.id = c.id;
ALTER TABLE ragsidecar_memory_chunks ALTER COLUMN key SET NOT NULL, DROP COLUMN terms;
CREATE INDEX ragsidecar_memory_chunks_changes ON ragsidecar_memory_chunks (space, change);

-- No foreign key (a row check per removal would slow every write): rows go with their space.
CREATE TABLE ragsidecar_memory_removals (
    space bigint NOT NULL,
    tenant text NOT NULL,
    change bigint NOT NULL,
    key text NOT NULL
);
CREATE INDEX ragsidecar_memory_removals_changes ON ragsidecar_memory_removals (space, change);

-- BM25 in SQL, and the dense HNSW indexes the sidecar created per dimension (ragsidecar_memory_chunks_hnsw_<d>).
DROP TABLE ragsidecar_memory_postings;
DO $$
DECLARE
    hnsw text;
BEGIN
    FOR hnsw IN SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()
                AND tablename = 'ragsidecar_memory_chunks' AND indexname LIKE 'ragsidecar\_memory\_chunks\_hnsw\_%'
    LOOP
        EXECUTE format('DROP INDEX %I', hnsw);
    END LOOP;
END
$$;

-- Under [store] row_level_security, the per-database bound of the binding corpora (a sum over every tenant's
-- partitions) and the sweep of orphaned corpora read across tenants, as in 0003.
CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_partitions
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_documents
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_spaces
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_chunks
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_removals
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
