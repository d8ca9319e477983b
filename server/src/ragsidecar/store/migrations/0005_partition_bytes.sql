-- A partition's bytes (its documents' ids, texts and metadata in UTF-8, as MemoryDocument.size counts them), kept
-- by every write, so that all chat bindings' corpora together stay within retrieval.binding_store_bytes (one sum
-- over the binding partitions per append, never a scan of their documents).
ALTER TABLE ragsidecar_memory_partitions ADD COLUMN bytes bigint NOT NULL DEFAULT 0;

UPDATE ragsidecar_memory_partitions p SET bytes = coalesce((
    SELECT sum(octet_length(d.id) + octet_length(d.text)
               + coalesce((SELECT sum(octet_length(k) + octet_length(v)) FROM jsonb_each_text(d.metadata) AS m(k, v)), 0))
    FROM ragsidecar_memory_documents d WHERE d.partition = p.id), 0);

CREATE INDEX ragsidecar_memory_partitions_namespace ON ragsidecar_memory_partitions (namespace);
