import type { DescService } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { callMapped, type CallOptions } from "./call.js";

type UnaryMethods<C> = {
  [K in keyof C as C[K] extends (request: never, options?: never) => Promise<unknown> ? K : never]: C[K];
};

/**
 * A generated connect client whose unary RPCs take this package's CallOptions and reject with typed
 * RagSidecarError subclasses instead of ConnectError. Requests and responses are the generated messages.
 */
export type TypedServiceClient<S extends DescService> = {
  [K in keyof UnaryMethods<Client<S>>]: Client<S>[K] extends (request: infer Req, options?: never) => Promise<infer Res>
    ? (request: Req, options?: CallOptions) => Promise<Res>
    : never;
};

export function typedServiceClient<S extends DescService>(service: S, client: Client<S>): TypedServiceClient<S> {
  const typed: Record<string, unknown> = {};
  for (const method of service.methods) {
    if (method.methodKind !== "unary") continue;
    const call = (client as unknown as Record<string, (request: unknown, options: object) => Promise<unknown>>)[method.localName];
    if (!call) continue;
    typed[method.localName] = (request: unknown, options: CallOptions = {}) => callMapped(call, request, options);
  }
  return typed as TypedServiceClient<S>;
}
