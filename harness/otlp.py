"""A real OTLP/HTTP trace receiver for tests: decodes the protobuf the operator's exporter sends.

It listens on 127.0.0.1 (a free port), accepts ``POST /v1/traces`` with an
``ExportTraceServiceRequest`` body, and keeps every span it decoded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass
class Receiver:
    port: int = 0
    spans: list[Span] = field(default_factory=list)
    resources: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                self.resources.append(attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


def attributes(span: Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for attribute in span.attributes:
        value = attribute.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[attribute.key] = [v.string_value for v in value.array_value.values]
        else:
            out[attribute.key] = getattr(value, kind) if kind else None
    return out


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.add(request)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
