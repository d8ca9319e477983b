import * as net from "node:net";
import type * as http2 from "node:http2";
import { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { DEFAULT_DEADLINES_MS, retrying, retryPolicy, withDeadlines, type CallKind, type RetryOptions } from "./retry.js";

/** TLS settings; `true` means TLS with the system's trusted CAs. */
export interface TlsOptions {
  /** PEM CA bundle trusted for the server certificate (a private CA or a self-signed certificate). */
  readonly ca?: string | Buffer | undefined;
  /** PEM client certificate and key, for mutual TLS. */
  readonly cert?: string | Buffer | undefined;
  readonly key?: string | Buffer | undefined;
  /** Name checked against the server certificate (SNI); defaults to the address's host. */
  readonly serverName?: string | undefined;
  /** Set false only in tests: accepts any certificate. Defaults to true. */
  readonly rejectUnauthorized?: boolean | undefined;
}

export interface ConnectionOptions {
  /** "host:port" (e.g. "127.0.0.1:50151") or a URL ("http://host:port", "https://host:port"). */
  readonly address?: string | undefined;
  /** Path of the sidecar's Unix socket (`[server] unix_socket`); exclusive with address. */
  readonly socketPath?: string | undefined;
  /** Bearer token sent as `authorization: Bearer <token>` (the sidecar's RAGSIDECAR_TOKEN); a function is asked per call. */
  readonly token?: string | (() => string | Promise<string>) | undefined;
  /** TLS; omit (or false) for plaintext HTTP/2. */
  readonly tls?: boolean | TlsOptions | undefined;
  /**
   * Deadline of every call that gives no timeoutMs of its own, whatever its kind (0 or less: none); unset, each
   * kind has its own (deadlinesMs).
   */
  readonly defaultTimeoutMs?: number | undefined;
  /**
   * Deadline per call kind of a call that gives no timeoutMs of its own (defaults: probe 5000, read 30000, write
   * 60000 ms; docs/clients.md). defaultTimeoutMs, when set, replaces them all.
   */
  readonly deadlinesMs?: Partial<Record<CallKind, number>> | undefined;
  /**
   * How calls that are safe to repeat (Rerank, Search, health, the read-only retrieval calls) are retried after a
   * transient failure; false turns retries off. Writes are never retried. Defaults: DEFAULT_RETRY.
   */
  readonly retry?: RetryOptions | false | undefined;
  /** Extra connect interceptors, run after the authorization one. */
  readonly interceptors?: readonly Interceptor[] | undefined;
}

export interface OpenTransport {
  readonly transport: Transport;
  /** "host:port" (the address as given) or "unix:<socketPath>", which every failed call's message ends with. */
  readonly target: string;
  /** Closes the HTTP/2 connection and every open stream. */
  close(): void;
}

export function openTransport(options: ConnectionOptions): OpenTransport {
  if ((options.address === undefined) === (options.socketPath === undefined)) {
    throw new TypeError("createClient needs exactly one of address and socketPath");
  }
  const tls = options.tls === true ? {} : options.tls || undefined;
  const scheme = tls ? "https" : "http";
  let baseUrl: string;
  const nodeOptions: http2.SecureClientSessionOptions = {};
  if (options.socketPath !== undefined) {
    const socketPath = options.socketPath;
    // The authority is only the :authority header; every connection goes to the socket.
    baseUrl = `${scheme}://localhost`;
    nodeOptions.createConnection = () => net.connect(socketPath);
    if (tls) {
      throw new TypeError("TLS over a Unix socket is not supported; the socket is protected by its file mode");
    }
  } else {
    baseUrl = normalizeAddress(options.address as string, scheme);
  }
  if (tls) {
    if (tls.ca !== undefined) nodeOptions.ca = tls.ca;
    if (tls.cert !== undefined) nodeOptions.cert = tls.cert;
    if (tls.key !== undefined) nodeOptions.key = tls.key;
    if (tls.serverName !== undefined) nodeOptions.servername = tls.serverName;
    if (tls.rejectUnauthorized !== undefined) nodeOptions.rejectUnauthorized = tls.rejectUnauthorized;
  }
  const target = options.socketPath !== undefined ? `unix:${options.socketPath}` : (options.address as string);
  // The host's interceptors come after the retries, so they see every attempt.
  const interceptors: Interceptor[] = [namingTheSidecar(target), retrying(retryPolicy(options.retry))];
  const token = options.token;
  if (token !== undefined) {
    interceptors.push((next) => async (request) => {
      const value = typeof token === "function" ? await token() : token;
      request.header.set("authorization", `Bearer ${value}`);
      return next(request);
    });
  }
  interceptors.push(...(options.interceptors ?? []), refusedStreamsUnavailable);
  const sessionManager = new Http2SessionManager(baseUrl, { idleConnectionTimeoutMs: 60_000 }, nodeOptions);
  const transport = withDeadlines(createGrpcTransport({ baseUrl, sessionManager, interceptors }), deadlinesOf(options),
    options.defaultTimeoutMs);
  return { transport, target, close: () => sessionManager.abort() };
}

/**
 * The outermost interceptor: a failed call's message ends with the sidecar it called (`... [sidecar 127.0.0.1:50151]`),
 * as the Java client's do, so that a host with several sidecars, or a wrong address, is told which one failed. The
 * status, metadata and google.rpc details stay; the original error is the cause.
 */
function namingTheSidecar(target: string): Interceptor {
  return (next) => async (request) => {
    try {
      return await next(request);
    } catch (error) {
      const failed = ConnectError.from(error);
      const message = [failed.rawMessage, `[sidecar ${target}]`].filter((part) => part !== "").join(" ");
      const named = new ConnectError(message, failed.code, failed.metadata, undefined, failed);
      named.details = failed.details;
      throw named;
    }
  };
}

/**
 * The innermost interceptor: a stream the server refused (HTTP/2 RST_STREAM REFUSED_STREAM, as a sidecar that is
 * shutting down answers the calls it will not start) fails UNAVAILABLE, not INTERNAL: the server never saw the call,
 * so it is retried like any transient failure (gRPC's own clients do the same).
 */
const refusedStreamsUnavailable: Interceptor = (next) => async (request) => {
  try {
    return await next(request);
  } catch (error) {
    const failed = ConnectError.from(error);
    if (failed.code !== Code.Internal || !refusedStream(failed)) throw error;
    const unavailable = new ConnectError(failed.rawMessage, Code.Unavailable, failed.metadata, undefined, failed);
    unavailable.details = failed.details;
    throw unavailable;
  }
};

function refusedStream(error: unknown): boolean {
  for (let cause = error; cause instanceof Error; cause = cause.cause) {
    if ((cause as { code?: unknown }).code === "ERR_HTTP2_STREAM_ERROR" && cause.message.includes("NGHTTP2_REFUSED_STREAM")) {
      return true;
    }
  }
  return false;
}

function deadlinesOf(options: ConnectionOptions): Record<CallKind, number> {
  const all = options.defaultTimeoutMs;
  if (all !== undefined) return { probe: all, read: all, write: all };
  return { ...DEFAULT_DEADLINES_MS, ...options.deadlinesMs };
}

function normalizeAddress(address: string, scheme: string): string {
  if (/^https?:\/\//.test(address)) {
    return address.replace(/\/+$/, "");
  }
  if (address.startsWith("unix:")) {
    throw new TypeError(`use socketPath for Unix sockets, not address ${JSON.stringify(address)}`);
  }
  return `${scheme}://${address}`;
}
