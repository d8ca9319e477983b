// OpenTelemetry: a call made inside the host's span reaches the sidecar with the host's trace id, and the sidecar's
// RPC span (a child of the host's span) and its stage spans arrive at a real OTLP/gRPC receiver
// (tests/otlp_receiver.py, started here beside a sidecar of its own that exports to it).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { TraceFlags, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { createClient } from "../src/index.ts";
import { openTelemetryInterceptor } from "../src/tracing.ts";
import { REPO_ROOT, sidecarBinary, startSidecar, type Sidecar } from "./support/sidecar.ts";

const HOST_TRACE = "7a3c5d9e1f2b4a6c8e0d2f4a6b8c0e1d";
const HOST_SPAN = "53995c3f42cd8ad8";
const STAGES = ["rerank", "tokenize", "queue wait", "inference batch"];

interface ReceivedSpan {
  readonly name: string;
  readonly trace_id: string;
  readonly span_id: string;
  readonly parent_span_id: string;
}

/** tests/otlp_receiver.py as a child process: its port, and the spans it has printed so far. */
async function startReceiver(): Promise<{ port: number; spans: ReceivedSpan[]; stop(): void }> {
  const python = path.join(path.dirname(sidecarBinary()), "python");
  const script = path.join(REPO_ROOT, "tests", "otlp_receiver.py");
  const child = spawn(python, [script], { stdio: ["pipe", "pipe", "inherit"] });
  const spans: ReceivedSpan[] = [];
  const lines = createInterface({ input: child.stdout });
  const port = await new Promise<number>((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`the OTLP receiver exited (${code})`)));
    lines.on("line", (line) => {
      const listening = /^port (\d+)$/.exec(line);
      if (listening) resolve(Number(listening[1]));
      else spans.push(JSON.parse(line) as ReceivedSpan);
    });
  });
  return { port, spans, stop: () => child.kill("SIGTERM") };
}

async function traceOf(spans: ReceivedSpan[], done: (mine: ReceivedSpan[]) => boolean): Promise<ReceivedSpan[]> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const mine = spans.filter((s) => s.trace_id === HOST_TRACE);
    if (done(mine) || Date.now() > deadline) return mine;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("OpenTelemetry", () => {
  const dir = mkdtempSync(path.join(tmpdir(), "ragsidecar-tracing-"));
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  let sidecar: Sidecar | undefined;
  before(async () => {
    // What a host's OpenTelemetry SDK does at start-up: a context manager that follows async calls.
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    receiver = await startReceiver();
    sidecar = await startSidecar({
      dir,
      env: { OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${receiver.port}`, OTEL_BSP_SCHEDULE_DELAY: "100" },
    });
  });
  after(async () => {
    await sidecar?.stop();
    receiver?.stop();
    context.disable();
    rmSync(dir, { recursive: true, force: true });
  });

  it("a call inside the host's span continues its trace in the sidecar, stage spans beneath", async () => {
    const client = createClient({ address: sidecar!.address, interceptors: [openTelemetryInterceptor()] });
    try {
      const hostSpan = trace.wrapSpanContext({
        traceId: HOST_TRACE,
        spanId: HOST_SPAN,
        traceFlags: TraceFlags.SAMPLED,
      });
      await context.with(trace.setSpan(context.active(), hostSpan), () =>
        client.reranker.rerank({
          query: "how do cells divide",
          documents: [
            { id: "mitosis", text: "Mitosis is how a cell divides into two identical cells." },
            { id: "stocks", text: "The stock market closed higher today." },
          ],
        }),
      );
    } finally {
      client.close();
    }
    const method = "ragsidecar.v1.RerankerService/Rerank";
    const spans = await traceOf(receiver.spans, (mine) =>
      [method, ...STAGES].every((name) => mine.some((s) => s.name === name)),
    );
    const rpc = spans.find((s) => s.name === method);
    assert.ok(rpc, `no RPC span in ${JSON.stringify(spans.map((s) => s.name))}`);
    assert.equal(rpc.parent_span_id, HOST_SPAN);
    const byId = new Map(spans.map((s) => [s.span_id, s]));
    for (const stage of STAGES) {
      const found = spans.filter((s) => s.name === stage);
      assert.ok(found.length > 0, `no ${stage} span`);
      for (let span of found) {
        while (span.parent_span_id !== rpc.span_id) {
          const parent = byId.get(span.parent_span_id);
          assert.ok(parent, `${stage} is not beneath the RPC span`);
          span = parent;
        }
      }
    }
  });
});
