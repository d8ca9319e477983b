package io.ragsidecar.client;

import io.ragsidecar.v1.MemoryDocument;
import java.time.Instant;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;

/**
 * A MEMORY document as the sidecar holds it, from {@link SidecarRetrieval#getDocuments} or
 * {@link SidecarRetrieval#listDocuments}.
 *
 * @param id the document's id
 * @param text its text
 * @param metadata its typed metadata and its string metadata (as strings), as {@link Metadata#toJava} gives them
 * @param expiresAt when it expires; empty when it never does
 * @param created when its id was first written (server clock)
 * @param updated when it last changed
 * @param proto the document as sent
 */
public record StoredDocument(String id, String text, Map<String, Object> metadata, Optional<Instant> expiresAt,
    Instant created, Instant updated, MemoryDocument proto) {

  public StoredDocument {
    Objects.requireNonNull(id, "id");
    Objects.requireNonNull(text, "text");
    Objects.requireNonNull(metadata, "metadata");
    Objects.requireNonNull(expiresAt, "expiresAt");
    Objects.requireNonNull(proto, "proto");
  }

  static StoredDocument fromProto(MemoryDocument d) {
    Map<String, Object> metadata = new LinkedHashMap<>(d.getMetadataMap());
    metadata.putAll(Metadata.toJava(d.getTypedMetadataMap()));
    return new StoredDocument(d.getId(), d.getText(), Collections.unmodifiableMap(metadata),
        d.hasExpiresAt() ? Optional.of(Metadata.instant(d.getExpiresAt())) : Optional.empty(),
        Metadata.instant(d.getCreated()), Metadata.instant(d.getUpdated()), d);
  }
}
