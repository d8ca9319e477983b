package io.ragsidecar.client;

import io.grpc.ManagedChannel;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The real Python sidecar, started as a child process for the tests: {@code <repo>/.venv/bin/ragsidecar serve} on a
 * free port (and optionally a Unix socket), with the repository's configuration and models. {@link #start} returns
 * once grpc.health.v1 reports SERVING; {@link #close} stops the process (a JVM shutdown hook does too, should the test
 * run be killed).
 *
 * <p>The executable can be overridden with the system property or environment variable {@code RAGSIDECAR_BIN}, the
 * repository root with the system property {@code ragsidecar.repoRoot} (set by the POM).
 */
public final class Sidecar implements AutoCloseable {
  private static final Duration STARTUP_TIMEOUT = Duration.ofSeconds(90);
  private static final Pattern TCP = Pattern.compile("ragsidecar listening on (?!unix:)(\\S+):(\\d+)\\s*$");
  private static final Pattern UNIX = Pattern.compile("ragsidecar listening on unix:(\\S+)\\s*$");
  private static final AtomicInteger COUNT = new AtomicInteger();

  private final String name;
  private final Process process;
  private final Thread shutdownHook;
  private final Path log;
  private final List<String> stdout = new ArrayList<>();
  private final Path unixSocket;
  private final Path workDir;
  private volatile int port;
  private volatile int httpPort;
  private volatile boolean closed;

  public static Path repoRoot() {
    return Paths.get(System.getProperty("ragsidecar.repoRoot", "../..")).toAbsolutePath().normalize();
  }

  static Path executable() {
    String override = System.getProperty("RAGSIDECAR_BIN", System.getenv("RAGSIDECAR_BIN"));
    return override != null && !override.isEmpty()
        ? Paths.get(override).toAbsolutePath()
        : repoRoot().resolve(".venv/bin/ragsidecar");
  }

  /** Starts a sidecar; {@code token} non-null requires it as bearer token; {@code unixSocket} also listens there. */
  public static Sidecar start(String token, boolean unixSocket) {
    return start(token, unixSocket, false);
  }

  /**
   * Starts a sidecar as {@link #start(String, boolean)} does; with {@code ownKnowledge} it runs on a copy of the
   * repository's configuration whose {@code [paths]} point into a fresh temporary folder: {@code data_dir} at
   * {@code <tmp>/data}, {@code knowledge_roots} at {@code <tmp>/knowledge} ({@link #knowledgeRoot()}, empty, for the
   * test to fill), {@code models_dir} at the repository's {@code models/}. The folder is deleted on {@link #close}.
   */
  public static Sidecar start(String token, boolean unixSocket, boolean ownKnowledge) {
    return start(token, unixSocket, ownKnowledge, 0);
  }

  /** Starts a plain sidecar on this TCP port (for a client that was built before the sidecar started). */
  static Sidecar startOnPort(int port) {
    return start(null, false, false, port);
  }

  /** Starts a sidecar on this TCP port, with its own knowledge as {@link #start(String, boolean, boolean)} has it. */
  static Sidecar startOnPort(int port, boolean ownKnowledge) {
    return start(null, false, ownKnowledge, port);
  }

  /**
   * Starts a sidecar with its own knowledge, as {@link #start(String, boolean, boolean)} has it, that also serves the
   * HTTP API ({@link #httpUrl()}): for the frameworks' own Cohere and OpenAI clients pointed at it, and the adapters'
   * embedding models.
   */
  public static Sidecar startWithHttp() {
    int httpPort = ConnectionTest.freePort();
    Sidecar sidecar = start(null, false, true, 0, Map.of("RAGSIDECAR_HTTP_PORT", String.valueOf(httpPort)));
    sidecar.httpPort = httpPort;
    return sidecar;
  }

  /** Starts a plain sidecar with these environment variables added (the OTEL_* ones, say). */
  static Sidecar startWithEnvironment(Map<String, String> environment) {
    return start(null, false, false, 0, environment);
  }

  private static Sidecar start(String token, boolean unixSocket, boolean ownKnowledge, int port) {
    return start(token, unixSocket, ownKnowledge, port, Map.of());
  }

  private static Sidecar start(String token, boolean unixSocket, boolean ownKnowledge, int port,
      Map<String, String> environment) {
    Path bin = executable();
    if (!Files.isExecutable(bin)) {
      throw new IllegalStateException("no ragsidecar executable at " + bin
          + ": run `make setup` in the repository root, or set RAGSIDECAR_BIN");
    }
    try {
      return new Sidecar(bin, token, unixSocket, ownKnowledge, port, environment);
    } catch (IOException e) {
      throw new IllegalStateException("cannot start " + bin, e);
    }
  }

  private Sidecar(Path bin, String token, boolean withUnixSocket, boolean ownKnowledge, int tcpPort,
      Map<String, String> environment) throws IOException {
    int n = COUNT.incrementAndGet();
    name = "sidecar-" + n + (token != null ? "-auth" : "") + (withUnixSocket ? "-unix" : "")
        + (ownKnowledge ? "-knowledge" : "");
    Path logs = Paths.get("target", "sidecar-logs").toAbsolutePath();
    Files.createDirectories(logs);
    log = logs.resolve(name + ".log");
    unixSocket = withUnixSocket
        ? Paths.get("/tmp", "ragsidecar-java-" + ProcessHandle.current().pid() + "-" + n + ".sock")
        : null;
    if (unixSocket != null) {
      Files.deleteIfExists(unixSocket);
    }

    Path config = repoRoot().resolve("config/ragsidecar.toml");
    if (ownKnowledge) {
      workDir = Files.createTempDirectory("ragsidecar-java-").toRealPath();
      Files.createDirectories(workDir.resolve("knowledge"));
      Files.createDirectories(workDir.resolve("data"));
      Path own = workDir.resolve("ragsidecar.toml");
      Files.writeString(own, withOwnPaths(Files.readString(config), workDir));
      config = own;
    } else {
      workDir = null;
    }
    List<String> command = new ArrayList<>(List.of(bin.toString(), "serve",
        "--config", config.toString(), "--port", String.valueOf(tcpPort), "--metrics-port", "0"));
    if (unixSocket != null) {
      command.add("--unix-socket");
      command.add(unixSocket.toString());
    }
    ProcessBuilder pb = new ProcessBuilder(command).directory(repoRoot().toFile())
        .redirectError(ProcessBuilder.Redirect.to(log.toFile()));
    Map<String, String> env = pb.environment();
    env.remove("RAGSIDECAR_TOKEN");
    env.remove("RAGSIDECAR_CONFIG");
    env.put("PYTHONUNBUFFERED", "1");
    env.putAll(environment);
    if (token != null) {
      env.put("RAGSIDECAR_TOKEN", token);
    }
    process = pb.start();
    shutdownHook = new Thread(this::stop, name + "-shutdown");
    Runtime.getRuntime().addShutdownHook(shutdownHook);
    try {
      awaitServing();
    } catch (RuntimeException | Error e) {
      close();
      throw e;
    }
  }

  /**
   * The configuration text with the {@code models_dir}, {@code data_dir} and {@code knowledge_roots} lines of its
   * {@code [paths]} table replaced by absolute paths (added when missing).
   */
  static String withOwnPaths(String toml, Path workDir) {
    Map<String, String> replacements = new java.util.LinkedHashMap<>();
    replacements.put("models_dir", toml(repoRoot().resolve("models").toString()));
    replacements.put("data_dir", toml(workDir.resolve("data").toString()));
    replacements.put("knowledge_roots", "[" + toml(workDir.resolve("knowledge").toString()) + "]");
    StringBuilder out = new StringBuilder();
    boolean inPaths = false;
    boolean sawPaths = false;
    for (String line : toml.split("\n", -1)) {
      String trimmed = line.trim();
      if (trimmed.startsWith("[")) {
        if (inPaths) {
          replacements.forEach((k, v) -> out.append(k).append(" = ").append(v).append('\n'));
          replacements.clear();
        }
        inPaths = trimmed.equals("[paths]");
        sawPaths |= inPaths;
      } else if (inPaths) {
        String key = trimmed.split("=", 2)[0].trim();
        if (replacements.containsKey(key)) {
          out.append(key).append(" = ").append(replacements.remove(key)).append('\n');
          continue;
        }
      }
      out.append(line).append('\n');
    }
    if (!sawPaths || inPaths) {
      if (!sawPaths) {
        out.append("\n[paths]\n");
      }
      replacements.forEach((k, v) -> out.append(k).append(" = ").append(v).append('\n'));
    }
    return out.toString();
  }

  private static String toml(String s) {
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }

  private void awaitServing() {
    long deadline = System.nanoTime() + STARTUP_TIMEOUT.toNanos();
    CompletableFuture<Integer> tcp = new CompletableFuture<>();
    CompletableFuture<String> unix = new CompletableFuture<>();
    if (unixSocket == null) {
      unix.complete("");
    }
    Thread reader = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(
          new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          synchronized (stdout) {
            stdout.add(line);
          }
          Matcher m = TCP.matcher(line);
          if (m.find()) {
            tcp.complete(Integer.parseInt(m.group(2)));
          }
          m = UNIX.matcher(line);
          if (m.find()) {
            unix.complete(m.group(1));
          }
        }
      } catch (IOException ignored) {
        // The process ended.
      }
      tcp.completeExceptionally(new IllegalStateException("sidecar stdout closed before it listened"));
      unix.completeExceptionally(new IllegalStateException("sidecar stdout closed before it listened on unix"));
    }, name + "-stdout");
    reader.setDaemon(true);
    reader.start();
    try {
      port = tcp.get(remaining(deadline), TimeUnit.NANOSECONDS);
      unix.get(remaining(deadline), TimeUnit.NANOSECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(name + ": interrupted while starting");
    } catch (ExecutionException | TimeoutException e) {
      throw new IllegalStateException(name + " did not start listening: " + diagnostics(), e);
    }

    ManagedChannel channel = NettyChannelBuilder.forAddress("127.0.0.1", port).usePlaintext().build();
    try {
      HealthCheckResponse.ServingStatus status = null;
      while (System.nanoTime() < deadline) {
        if (!process.isAlive()) {
          throw new IllegalStateException(name + " exited with " + process.exitValue() + ": " + diagnostics());
        }
        try {
          status = HealthGrpc.newBlockingStub(channel).withDeadlineAfter(2, TimeUnit.SECONDS)
              .check(HealthCheckRequest.newBuilder().setService("").build()).getStatus();
          if (status == HealthCheckResponse.ServingStatus.SERVING) {
            return;
          }
        } catch (io.grpc.StatusRuntimeException notYet) {
          // Not answering yet.
        }
        Thread.sleep(200);
      }
      throw new IllegalStateException(name + " not SERVING within " + STARTUP_TIMEOUT + " (last: " + status + "): "
          + diagnostics());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(name + ": interrupted while starting");
    } finally {
      channel.shutdownNow();
    }
  }

  private static long remaining(long deadline) {
    return Math.max(1, deadline - System.nanoTime());
  }

  private String diagnostics() {
    StringBuilder sb = new StringBuilder();
    synchronized (stdout) {
      sb.append("stdout=").append(stdout);
    }
    try {
      List<String> lines = Files.readAllLines(log);
      sb.append("; stderr (").append(log).append(") tail:\n")
          .append(String.join("\n", lines.subList(Math.max(0, lines.size() - 30), lines.size())));
    } catch (IOException e) {
      sb.append("; no stderr log");
    }
    return sb.toString();
  }

  public int port() {
    return port;
  }

  /** The HTTP API's base URL, {@code http://127.0.0.1:<port>}, of a sidecar {@link #startWithHttp() serving it}. */
  public String httpUrl() {
    if (httpPort == 0) {
      throw new IllegalStateException(name + " does not serve HTTP: start it with startWithHttp()");
    }
    return "http://127.0.0.1:" + httpPort;
  }

  Path unixSocket() {
    return unixSocket;
  }

  /** The sidecar's only knowledge root (started with own knowledge); relative knowledge paths resolve against it. */
  public Path knowledgeRoot() {
    if (workDir == null) {
      throw new IllegalStateException(name + " runs on the repository's configuration");
    }
    return workDir.resolve("knowledge");
  }

  /** A client builder aimed at this sidecar over TCP. */
  public RagSidecarClient.Builder clientBuilder() {
    return RagSidecarClient.builder().host("127.0.0.1").port(port).defaultDeadline(Duration.ofSeconds(30));
  }

  @Override
  public void close() {
    stop();
    try {
      Runtime.getRuntime().removeShutdownHook(shutdownHook);
    } catch (IllegalStateException shuttingDown) {
      // The hook is running or will run; stop() is idempotent.
    }
  }

  private synchronized void stop() {
    if (closed) {
      return;
    }
    closed = true;
    List<ProcessHandle> children = process.descendants().toList();
    process.destroy();
    try {
      if (!process.waitFor(15, TimeUnit.SECONDS)) {
        process.destroyForcibly();
        process.waitFor(5, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
    children.forEach(ProcessHandle::destroyForcibly);
    if (workDir != null) {
      try (var paths = Files.walk(workDir)) {
        paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      } catch (IOException ignored) {
        // Best effort.
      }
    }
    if (unixSocket != null) {
      try {
        Files.deleteIfExists(unixSocket);
      } catch (IOException ignored) {
        // Best effort.
      }
    }
  }

  @Override
  public String toString() {
    return name + "[port=" + port + (unixSocket != null ? ", unix=" + unixSocket : "") + "]";
  }
}
