package io.ragsidecar.client;

import java.time.Instant;
import java.util.List;
import java.util.Objects;
import java.util.Optional;

/**
 * The sidecar's model set at one point in time: the answer of one {@code ListModels} call. Immutable.
 *
 * @param models every configured model, in configuration order
 * @param generation the sidecar's configuration generation; increases with every successful reload
 * @param lastReloadError the error of the sidecar's last failed reload; empty when it succeeded
 * @param fetchedAt when this client received the answer
 */
public record ModelSnapshot(List<ModelInfo> models, long generation, String lastReloadError, Instant fetchedAt) {

  public ModelSnapshot {
    models = List.copyOf(models);
    lastReloadError = lastReloadError == null ? "" : lastReloadError;
    Objects.requireNonNull(fetchedAt, "fetchedAt");
  }

  /** The model with exactly this (case-sensitive) identifier. */
  public Optional<ModelInfo> model(String id) {
    if (id == null) {
      return Optional.empty();
    }
    return models.stream().filter(m -> m.id().equals(id)).findFirst();
  }

  /**
   * Whether the sidecar can serve the model: it is configured under exactly this identifier and did not fail to
   * load (a model still loading counts, as the sidecar serves it once warmed up).
   */
  public boolean supports(String id) {
    return model(id).map(m -> m.state() != ModelInfo.State.FAILED).orElse(false);
  }

  /** The model used for requests that name none. */
  public Optional<ModelInfo> defaultModel() {
    return models.stream().filter(ModelInfo::isDefault).findFirst();
  }
}
