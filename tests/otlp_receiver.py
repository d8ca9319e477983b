"""A real OTLP/gRPC trace receiver on loopback (opentelemetry-proto's TraceService), for tests and benchmarks.

In-process: `start()` gives a Receiver that keeps every span. As a program (the Java and TypeScript client
suites run it beside the sidecar): prints `port <N>` and then one JSON object per span received, one a line:
    python tests/otlp_receiver.py
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
from collections.abc import Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

WAIT_S = 60.0


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span exported to it, with the service.name of its resource."""

    def __init__(self, on_span: Callable[[str, trace_pb2.Span], None] | None = None) -> None:
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self.port = 0
        self._on_span = on_span
        self._arrived = threading.Condition()

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext):
        with self._arrived:
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append((service, span))
                        if self._on_span:
                            self._on_span(service, span)
            self._arrived.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str, until: Callable[[list[trace_pb2.Span]], bool]) -> list[trace_pb2.Span]:
        """The spans of one trace, once `until` holds for them (waits for the exporter's batches)."""
        deadline = time.monotonic() + WAIT_S
        with self._arrived:
            while True:
                spans = [s for _, s in self.spans if s.trace_id.hex() == trace_id]
                if until(spans) or time.monotonic() > deadline:
                    return spans
                self._arrived.wait(0.2)


def start(receiver: Receiver) -> grpc.Server:
    """Serves the receiver on a free loopback port (receiver.port)."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    receiver.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server


def as_json(service: str, span: trace_pb2.Span) -> str:
    return json.dumps(
        {
            "service": service,
            "name": span.name,
            "trace_id": span.trace_id.hex(),
            "span_id": span.span_id.hex(),
            "parent_span_id": span.parent_span_id.hex(),
        }
    )


def main() -> None:
    printing = threading.Lock()

    def print_span(service: str, span: trace_pb2.Span) -> None:
        with printing:
            print(as_json(service, span), flush=True)

    receiver = Receiver(print_span)
    server = start(receiver)
    print(f"port {receiver.port}", flush=True)
    # Runs until its parent closes stdin (or kills it).
    sys.stdin.read()
    server.stop(None)


if __name__ == "__main__":
    main()
