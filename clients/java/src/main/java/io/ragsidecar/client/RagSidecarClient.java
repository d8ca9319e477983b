package io.ragsidecar.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ForwardingClientCall;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.TlsChannelCredentials;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse.ServingStatus;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.netty.shaded.io.netty.util.concurrent.DefaultThreadFactory;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;

/**
 * Client of a ragsidecar: one shared gRPC channel and a facade per service.
 *
 * <pre>{@code
 * try (RagSidecarClient client = RagSidecarClient.builder().host("127.0.0.1").port(50151).build()) {
 *   List<Reranker.RankedDocument> ranked = client.reranker().rerank(Reranker.Request.builder()
 *       .query("What is the capital of France?")
 *       .document("a", "Paris is the capital of France.")
 *       .document("b", "Bananas are rich in potassium.")
 *       .topN(1)
 *       .build());
 * }
 * }</pre>
 *
 * <p>Thread-safe: create one per sidecar and share it for the JVM's lifetime; every facade uses the same channel.
 * {@link #close()} shuts the channel and the background threads down. A host that asks
 * {@link Reranker#supports(String)} at start-up builds with {@link Builder#awaitReady(Duration)} (or calls
 * {@link #awaitReady(Duration)}) first: until the sidecar answered, nothing is supported.
 *
 * <p>Services: {@link #reranker()} ({@code RerankerService}), {@link #retrieval()} ({@code RetrievalService}),
 * {@link #chat()} ({@code ChatKnowledgeService}).
 */
public final class RagSidecarClient implements AutoCloseable {
  /** The sidecar's default TCP port. */
  public static final int DEFAULT_PORT = 50151;

  /** The grpc.health.v1 service name that is SERVING once the sidecar's default reranker model is ready. */
  public static final String RERANKER_HEALTH_SERVICE = "ragsidecar.v1.RerankerService";

  /** Longest single health check while waiting: a sidecar that starts late is noticed within about this long. */
  private static final Duration READINESS_POLL = Duration.ofMillis(500);

  private static final AtomicInteger CLIENTS = new AtomicInteger();

  private final ManagedChannel managedChannel;
  private final EventLoopGroup eventLoopGroup;
  private final ScheduledThreadPoolExecutor scheduler;
  private final ClientContext context;
  private final SidecarReranker reranker;
  private final SidecarRetrieval retrieval;
  private final SidecarChat chat;
  private final String target;
  private final AtomicBoolean closed = new AtomicBoolean();

  private RagSidecarClient(Builder b) {
    int id = CLIENTS.incrementAndGet();
    ChannelCredentials credentials = credentials(b);
    NettyChannelBuilder channelBuilder;
    if (b.unixSocket != null) {
      if (!Epoll.isAvailable()) {
        throw new UnsupportedOperationException("Unix domain sockets need netty's epoll transport (Linux)",
            Epoll.unavailabilityCause());
      }
      eventLoopGroup = new EpollEventLoopGroup(1, new DefaultThreadFactory("ragsidecar-uds-" + id, true));
      channelBuilder = NettyChannelBuilder.forAddress(new DomainSocketAddress(b.unixSocket.toString()), credentials)
          .eventLoopGroup(eventLoopGroup)
          .channelType(EpollDomainSocketChannel.class)
          // TCP keep-alive means nothing on a Unix socket; unset it so netty does not warn about it.
          .withOption(ChannelOption.SO_KEEPALIVE, null)
          .overrideAuthority(b.authority != null ? b.authority : "localhost");
      target = "unix:" + b.unixSocket;
    } else {
      eventLoopGroup = null;
      channelBuilder = NettyChannelBuilder.forAddress(b.host, b.port, credentials);
      if (b.authority != null) {
        channelBuilder.overrideAuthority(b.authority);
      }
      target = b.host + ":" + b.port;
    }
    channelBuilder.maxInboundMessageSize(b.maxInboundMessageSize);
    if (b.executor != null) {
      channelBuilder.executor(b.executor);
    }
    if (b.channelCustomizer != null) {
      b.channelCustomizer.accept(channelBuilder);
    }
    managedChannel = channelBuilder.build();
    List<ClientInterceptor> interceptors = new ArrayList<>();
    if (b.bearerToken != null) {
      interceptors.add(new BearerTokenInterceptor(b.bearerToken));
    }
    interceptors.addAll(b.interceptors);
    // Forward order: the token is attached first, so the host's interceptors see (and may log) complete headers.
    Channel channel = ClientInterceptors.interceptForward(managedChannel, interceptors);
    // Runs the model refresh and the retries of asynchronous calls (their waits, never their work).
    scheduler = new ScheduledThreadPoolExecutor(1, runnable -> {
      Thread t = new Thread(runnable, "ragsidecar-models-" + id);
      t.setDaemon(true);
      return t;
    });
    scheduler.setRemoveOnCancelPolicy(true);
    scheduler.setExecuteExistingDelayedTasksAfterShutdownPolicy(false);
    context = new ClientContext(channel, b.deadlines, b.retryPolicy, scheduler, target);
    reranker = new SidecarReranker(context, scheduler, b.modelRefreshInterval, managedChannel::resetConnectBackoff);
    retrieval = new SidecarRetrieval(context);
    chat = new SidecarChat(context);
    reranker.start();
  }

  private static ChannelCredentials credentials(Builder b) {
    if (!b.tls) {
      return InsecureChannelCredentials.create();
    }
    if (b.trustCertificate == null) {
      return TlsChannelCredentials.create();
    }
    try {
      return TlsChannelCredentials.newBuilder().trustManager(b.trustCertificate.toFile()).build();
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read the trust certificate " + b.trustCertificate, e);
    }
  }

  public static Builder builder() {
    return new Builder();
  }

  /** The reranker of this sidecar. The same instance on every call. */
  public SidecarReranker reranker() {
    return reranker;
  }

  /**
   * The retrieval service of this sidecar (knowledge-context injection for the host's {@code RetrievalSpi}, search,
   * MEMORY writes). The same unscoped instance on every call; {@link SidecarRetrieval#withScope(KnowledgeScope)}
   * derives one that sets the principal and scope of every request.
   */
  public SidecarRetrieval retrieval() {
    return retrieval;
  }

  /**
   * The chat knowledge service of this sidecar (grounding of chat turns, chat bindings). The same unscoped instance
   * on every call; {@link SidecarChat#withScope(KnowledgeScope)} derives one that sets the principal and scope of
   * every request.
   */
  public SidecarChat chat() {
    return chat;
  }

  /**
   * The client's channel, with the bearer token attached, for calling generated stubs directly (for example
   * {@code RetrievalServiceGrpc.newBlockingStub(client.channel())}). Owned by the client: do not shut it down.
   */
  public Channel channel() {
    return context.channel();
  }

  /**
   * Blocks until the sidecar is ready for reranking: its grpc.health.v1 status for
   * {@value #RERANKER_HEALTH_SERVICE} is SERVING (the default model is loaded) and a model snapshot taken since then
   * is current, so {@link Reranker#supports(String)} answers from it. A sidecar that starts after the client is
   * noticed within about half a second: the channel's reconnect back-off is reset on every poll.
   *
   * @return the model snapshot {@code supports} now answers from
   * @throws DeadlineExceededException naming the {@linkplain #target() target} when the sidecar is not ready in time
   * @throws RagSidecarException when the sidecar refuses the calls outright (for example a wrong bearer token)
   */
  public ModelSnapshot awaitReady(Duration timeout) {
    long deadline = System.nanoTime() + timeout.toNanos();
    String last = "no answer";
    Throwable lastFailure = null;
    for (;;) {
      Duration left = Duration.ofNanos(deadline - System.nanoTime());
      if (left.isNegative() || left.isZero()) {
        throw ErrorDetails.toException(Status.DEADLINE_EXCEEDED
            .withDescription("sidecar not ready within " + timeout + "; last: " + last)
            .withCause(lastFailure).asRuntimeException(), target);
      }
      Duration attempt = left.compareTo(READINESS_POLL) < 0 ? left : READINESS_POLL;
      managedChannel.resetConnectBackoff();
      try {
        ServingStatus status = HealthGrpc.newBlockingStub(context.channel())
            .withDeadlineAfter(attempt.toNanos(), TimeUnit.NANOSECONDS)
            .check(HealthCheckRequest.newBuilder().setService(RERANKER_HEALTH_SERVICE).build()).getStatus();
        if (status == ServingStatus.SERVING) {
          return reranker.refreshModels(left);
        }
        last = "health " + status;
      } catch (io.grpc.StatusRuntimeException failure) {
        Status.Code code = failure.getStatus().getCode();
        if (code != Status.Code.UNAVAILABLE && code != Status.Code.DEADLINE_EXCEEDED) {
          throw ErrorDetails.toException(failure, target);
        }
        Throwable cause = failure.getStatus().getCause();
        last = code + ": " + failure.getStatus().getDescription()
            + (cause == null ? "" : " (" + cause.getMessage() + ")");
        lastFailure = failure;
        if (code == Status.Code.DEADLINE_EXCEEDED) {
          continue;   // the attempt already took its time
        }
      }
      pause(attempt);
    }
  }

  /** Waits between two health answers that were not SERVING yet. */
  private static void pause(Duration attempt) {
    try {
      Thread.sleep(attempt.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw ErrorDetails.toException(Status.CANCELLED.withDescription("interrupted").withCause(e)
          .asRuntimeException());
    }
  }

  /** Where this client connects: {@code host:port} or {@code unix:/path}. */
  public String target() {
    return target;
  }

  /** Whether {@link #close()} was called. */
  public boolean isClosed() {
    return closed.get();
  }

  /**
   * Shuts the channel and background threads down, waiting up to five seconds for calls in flight; calls made
   * afterwards fail with {@link UnavailableException}. Idempotent.
   */
  @Override
  public void close() {
    if (!closed.compareAndSet(false, true)) {
      return;
    }
    scheduler.shutdownNow();
    managedChannel.shutdown();
    try {
      if (!managedChannel.awaitTermination(5, TimeUnit.SECONDS)) {
        managedChannel.shutdownNow();
        managedChannel.awaitTermination(1, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      managedChannel.shutdownNow();
      Thread.currentThread().interrupt();
    } finally {
      if (eventLoopGroup != null) {
        eventLoopGroup.shutdownGracefully(0, 1, TimeUnit.SECONDS);
      }
    }
  }

  @Override
  public String toString() {
    return "RagSidecarClient[" + target + (closed.get() ? ", closed" : "") + "]";
  }

  /** Adds {@code authorization: Bearer <token>} to every call. */
  private static final class BearerTokenInterceptor implements ClientInterceptor {
    private static final Metadata.Key<String> AUTHORIZATION =
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    private final String value;

    BearerTokenInterceptor(String token) {
      this.value = "Bearer " + token;
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void start(Listener<R> listener, Metadata headers) {
          headers.put(AUTHORIZATION, value);
          super.start(listener, headers);
        }
      };
    }
  }

  /**
   * Configures a {@link RagSidecarClient}. Defaults: {@code 127.0.0.1:50151}, plaintext, deadlines of 5 s for probes,
   * 30 s for reads and 60 s for writes ({@link CallKind}), and {@link RetryPolicy#defaults()} for the calls that are
   * safe to repeat (docs/clients.md).
   */
  public static final class Builder {
    private String host = "127.0.0.1";
    private int port = DEFAULT_PORT;
    private Path unixSocket;
    private final Map<CallKind, Duration> deadlines = new EnumMap<>(CallKind.class);
    private RetryPolicy retryPolicy = RetryPolicy.defaults();
    private String bearerToken;
    private boolean tls;
    private Path trustCertificate;
    private String authority;
    private int maxInboundMessageSize = 64 * 1024 * 1024;
    private Duration modelRefreshInterval = Duration.ofSeconds(30);
    private Executor executor;
    private Duration awaitReady;
    private final List<ClientInterceptor> interceptors = new ArrayList<>();
    private Consumer<ManagedChannelBuilder<?>> channelCustomizer;

    private Builder() {
      for (CallKind kind : CallKind.values()) {
        deadlines.put(kind, kind.defaultDeadline());
      }
    }

    /** Host name or address of the sidecar (default {@code 127.0.0.1}). */
    public Builder host(String host) {
      this.host = Objects.requireNonNull(host, "host");
      this.unixSocket = null;
      return this;
    }

    /** TCP port of the sidecar (default {@value RagSidecarClient#DEFAULT_PORT}). */
    public Builder port(int port) {
      if (port < 1 || port > 65535) {
        throw new IllegalArgumentException("port out of range: " + port);
      }
      this.port = port;
      this.unixSocket = null;
      return this;
    }

    /** Connects to a Unix domain socket instead of TCP (Linux, through netty's epoll transport). */
    public Builder unixSocket(Path path) {
      this.unixSocket = Objects.requireNonNull(path, "path");
      return this;
    }

    /** Deadline of each call that sets none itself, whatever its kind (default: per kind, {@link CallKind}). */
    public Builder defaultDeadline(Duration deadline) {
      for (CallKind kind : CallKind.values()) {
        deadline(kind, deadline);
      }
      return this;
    }

    /** Deadline of each call of this kind that sets none itself (default {@link CallKind#defaultDeadline()}). */
    public Builder deadline(CallKind kind, Duration deadline) {
      if (deadline.isNegative() || deadline.isZero()) {
        throw new IllegalArgumentException("deadline must be positive: " + deadline);
      }
      deadlines.put(Objects.requireNonNull(kind, "kind"), deadline);
      return this;
    }

    /**
     * How calls that are safe to repeat are retried after a transient failure (default {@link RetryPolicy#defaults()};
     * {@link RetryPolicy#none()} turns retries off). Writes are never retried.
     */
    public Builder retryPolicy(RetryPolicy policy) {
      this.retryPolicy = Objects.requireNonNull(policy, "policy");
      return this;
    }

    /**
     * Sends {@code authorization: Bearer <token>} with every call (the sidecar's {@code RAGSIDECAR_TOKEN});
     * {@code null} sends none.
     */
    public Builder bearerToken(String token) {
      this.bearerToken = token == null || token.isEmpty() ? null : token;
      return this;
    }

    /** Uses TLS, trusting the system's roots unless {@link #trustCertificate(Path)} is given (default off). */
    public Builder tls(boolean tls) {
      this.tls = tls;
      return this;
    }

    /** Uses TLS and trusts the PEM certificate(s) in this file (for a self-signed sidecar certificate). */
    public Builder trustCertificate(Path pemFile) {
      this.trustCertificate = Objects.requireNonNull(pemFile, "pemFile");
      this.tls = true;
      return this;
    }

    /** Authority (and TLS server name) to use instead of the target's host. */
    public Builder overrideAuthority(String authority) {
      this.authority = authority;
      return this;
    }

    /** Largest response accepted, in bytes (default 64 MiB, the sidecar's own default limit). */
    public Builder maxInboundMessageSize(int bytes) {
      if (bytes <= 0) {
        throw new IllegalArgumentException("maxInboundMessageSize must be positive: " + bytes);
      }
      this.maxInboundMessageSize = bytes;
      return this;
    }

    /** How often the model snapshot behind {@link Reranker#supports(String)} is refreshed (default 30 s). */
    public Builder modelRefreshInterval(Duration interval) {
      if (interval.isNegative() || interval.isZero()) {
        throw new IllegalArgumentException("interval must be positive: " + interval);
      }
      this.modelRefreshInterval = interval;
      return this;
    }

    /**
     * Executor that runs gRPC callbacks, and with them the completion of async results (default: gRPC's shared
     * cached pool). The client does not shut it down.
     */
    public Builder executor(Executor executor) {
      this.executor = executor;
      return this;
    }

    /**
     * Makes {@link #build()} wait up to {@code timeout} until the sidecar is ready for reranking
     * ({@link RagSidecarClient#awaitReady(Duration)}), so that {@link Reranker#supports(String)} answers right after
     * it; when it is not, {@code build()} closes the client and throws a {@link DeadlineExceededException} naming the
     * target. Default: {@code build()} does not wait.
     */
    public Builder awaitReady(Duration timeout) {
      if (timeout.isNegative() || timeout.isZero()) {
        throw new IllegalArgumentException("timeout must be positive: " + timeout);
      }
      this.awaitReady = timeout;
      return this;
    }

    /**
     * Adds interceptors to every call (tracing, metrics, retries); they run in the order given, after the bearer
     * token was attached. May be called more than once.
     */
    public Builder intercept(ClientInterceptor... interceptors) {
      for (ClientInterceptor interceptor : interceptors) {
        this.interceptors.add(Objects.requireNonNull(interceptor, "interceptor"));
      }
      return this;
    }

    /**
     * Adjusts the channel builder after the client's own settings, just before the channel is built (keep-alive,
     * idle timeout, retry policy, proxy, offload executors...). Changing the target or the credentials is not
     * supported.
     */
    public Builder channelCustomizer(Consumer<ManagedChannelBuilder<?>> customizer) {
      this.channelCustomizer = customizer;
      return this;
    }

    /**
     * Creates the client and starts fetching the model snapshot in the background. Does not block unless
     * {@link #awaitReady(Duration)} was set.
     */
    public RagSidecarClient build() {
      RagSidecarClient client = new RagSidecarClient(this);
      if (awaitReady != null) {
        try {
          client.awaitReady(awaitReady);
        } catch (RuntimeException notReady) {
          client.close();
          throw notReady;
        }
      }
      return client;
    }
  }
}
