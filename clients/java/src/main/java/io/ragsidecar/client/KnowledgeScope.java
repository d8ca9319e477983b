package io.ragsidecar.client;

import java.util.List;
import java.util.Objects;
import io.ragsidecar.v1.Principal;
import io.ragsidecar.v1.Scope;

/**
 * Who calls and in which isolation scope: the {@code principal} and {@code scope} every {@code RetrievalService}
 * request carries. {@link SidecarRetrieval#withScope(KnowledgeScope)} applies one to every call of a facade.
 *
 * <p>MEMORY knowledge and SEQUENTIAL cursors are partitioned by the exact {@code (tenant, session)}; an empty
 * {@code session} means tenant-wide (a partition of its own). The sidecar refuses an empty {@code principalId} with
 * {@link PermissionDeniedException} and an empty {@code tenant} with {@link ValidationException}; neither is checked
 * here, so that the sidecar stays the single authority.
 *
 * @param principalId stable identifier of the caller (user, agent or service account)
 * @param tenant tenant identifier
 * @param session session within the tenant; empty for tenant-wide
 * @param roles free-form roles of the caller, as the host's authority scope grants them
 */
public record KnowledgeScope(String principalId, String tenant, String session, List<String> roles) {

  public KnowledgeScope {
    Objects.requireNonNull(principalId, "principalId");
    Objects.requireNonNull(tenant, "tenant");
    session = session == null ? "" : session;
    roles = roles == null ? List.of() : List.copyOf(roles);
  }

  /** A scope without roles. */
  public KnowledgeScope(String principalId, String tenant, String session) {
    this(principalId, tenant, session, List.of());
  }

  /** A tenant-wide scope (empty session) without roles. */
  public static KnowledgeScope tenantWide(String principalId, String tenant) {
    return new KnowledgeScope(principalId, tenant, "");
  }

  /** The same caller in another session of the same tenant. */
  public KnowledgeScope withSession(String session) {
    return new KnowledgeScope(principalId, tenant, session, roles);
  }

  /** The request's {@code principal} message. */
  public Principal principal() {
    return Principal.newBuilder().setId(principalId).addAllRoles(roles).build();
  }

  /** The request's {@code scope} message. */
  public Scope scope() {
    return Scope.newBuilder().setTenant(tenant).setSession(session).build();
  }
}
