#!/usr/bin/env python3
"""A small OTLP/HTTP trace receiver: the collector the tracing tests export spans to.

clamp exports its spans over OTLP/HTTP (`POST /v1/traces`). This stand-in takes the
`ExportTraceServiceRequest` bodies, protobuf (`application/x-protobuf`) or JSON
(`application/json`, the http/json protocol), plain or gzip (`Content-Encoding: gzip`),
decodes them with the OpenTelemetry proto package, and appends every span as one JSON
line to `--out` (flushed line by line, so a test can read it while the receiver runs):

    {"traceId": "<32 hex>", "spanId": "<16 hex>", "parentSpanId": "" or "<16 hex>",
     "name", "kind": "SPAN_KIND_SERVER", "startTimeUnixNano", "endTimeUnixNano",
     "attributes": {key: value}, "events": [{"name", "timeUnixNano", "attributes"}],
     "links": [{"traceId", "spanId", "attributes"}],
     "status": {"code": "STATUS_CODE_UNSET", "message"},
     "resource": {key: value}, "scope": "<instrumentation scope name>"}

Attribute values are plain JSON values: strings, ints, doubles, bools, lists (arrays),
objects (key-value lists), hex strings (bytes), null (empty). It answers 200 with an
empty `ExportTraceServiceResponse` in the request's encoding, or 503 to the first
`--fail-first N` export requests (the exporter's retry path). `--port 0` picks a free
port; `--port-file` gets the bound port once it listens (written whole, then renamed in).
SIGTERM or SIGINT stops it cleanly.

    target/py-tools/bin/python tests/otlp/receiver.py --port 0 --port-file PORT --out spans.jsonl
"""
import argparse
import base64
import gzip
import json
import os
import re
import signal
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
HEX_ID = re.compile(r"[0-9a-fA-F]{16}|[0-9a-fA-F]{32}")


def value(v):
    """An `AnyValue` as a plain JSON value."""
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if which == "bytes_value":
        return v.bytes_value.hex()
    return None if which is None else getattr(v, which)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def span_record(span, resource, scope):
    return {
        "traceId": span.trace_id.hex(),
        "spanId": span.span_id.hex(),
        "parentSpanId": span.parent_span_id.hex(),
        "name": span.name,
        "kind": Span.SpanKind.Name(span.kind),
        "startTimeUnixNano": span.start_time_unix_nano,
        "endTimeUnixNano": span.end_time_unix_nano,
        "attributes": attributes(span.attributes),
        "events": [
            {"name": e.name, "timeUnixNano": e.time_unix_nano, "attributes": attributes(e.attributes)}
            for e in span.events
        ],
        "links": [
            {"traceId": k.trace_id.hex(), "spanId": k.span_id.hex(), "attributes": attributes(k.attributes)}
            for k in span.links
        ],
        "status": {"code": Status.StatusCode.Name(span.status.code), "message": span.status.message},
        "resource": resource,
        "scope": scope,
    }


def records(request):
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield span_record(span, resource, ss.scope.name)


def hex_ids_to_base64(doc):
    """OTLP/JSON writes trace and span ids as hex, where proto3 JSON expects base64."""
    def fix(obj, *keys):
        for k in keys:
            v = obj.get(k)
            if isinstance(v, str) and HEX_ID.fullmatch(v):
                obj[k] = base64.b64encode(bytes.fromhex(v)).decode()

    for rs in doc.get("resourceSpans", doc.get("resource_spans", [])):
        for ss in rs.get("scopeSpans", rs.get("scope_spans", [])):
            for span in ss.get("spans", []):
                fix(span, "traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
                for link in span.get("links", []):
                    fix(link, "traceId", "trace_id", "spanId", "span_id")
    return doc


def decode(body, content_type):
    request = ExportTraceServiceRequest()
    if content_type == JSON:
        doc = hex_ids_to_base64(json.loads(body))
        json_format.ParseDict(doc, request, ignore_unknown_fields=True)
    else:
        request.ParseFromString(body)
    return request


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's HTTP client expects
    server_version = "clamp-otlp-receiver"

    def do_POST(self):
        body = self.read_body()
        if self.path.split("?")[0] != "/v1/traces":
            return self.reply(404, "text/plain", b"only /v1/traces is served\n")
        content_type = (self.headers.get("Content-Type") or PROTOBUF).split(";")[0].strip().lower()
        if content_type not in (PROTOBUF, JSON):
            return self.reply(415, "text/plain", b"expected application/x-protobuf or application/json\n")
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            return self.reply(415, "text/plain", b"expected no Content-Encoding or gzip\n")
        with self.server.lock:
            self.server.requests += 1
            fail = self.server.requests <= self.server.fail_first
        if fail:
            return self.reply(503, "text/plain", b"failing on purpose (--fail-first)\n")
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            request = decode(body, content_type)
        except (OSError, EOFError, zlib.error, ValueError, DecodeError, json_format.ParseError) as e:
            return self.reply(400, "text/plain", f"undecodable export request: {e}\n".encode())
        self.server.write(records(request))
        if content_type == JSON:
            return self.reply(200, JSON, json_format.MessageToJson(ExportTraceServiceResponse()).encode())
        return self.reply(200, PROTOBUF, ExportTraceServiceResponse().SerializeToString())

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, code, content_type, body):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass  # quiet: the spans file is the record


class Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, out, fail_first):
        super().__init__(address, Handler)
        self.out = out
        self.fail_first = fail_first
        self.requests = 0
        self.lock = threading.Lock()

    def write(self, recs):
        with self.lock:
            for rec in recs:
                self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")
                self.out.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON-lines file the spans are appended to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4318, help="0 picks a free port")
    p.add_argument("--port-file", help="where to write the bound port once listening")
    p.add_argument("--fail-first", type=int, default=0, metavar="N",
                   help="answer the first N export requests with 503")
    args = p.parse_args()

    with open(args.out, "a", encoding="utf-8") as out:
        server = Receiver((args.host, args.port), out, args.fail_first)

        def stop(*_):  # shutdown() waits for serve_forever(), so not from its own thread
            threading.Thread(target=server.shutdown).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        port = server.server_address[1]
        if args.port_file:
            tmp = f"{args.port_file}.tmp"
            with open(tmp, "w") as f:
                f.write(f"{port}\n")
            os.replace(tmp, args.port_file)
        print(f"otlp receiver: listening on {args.host}:{port}, spans to {args.out}",
              file=sys.stderr, flush=True)
        server.serve_forever()
        server.server_close()


if __name__ == "__main__":
    main()
