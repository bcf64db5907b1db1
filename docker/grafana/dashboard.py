#!/usr/bin/env python3
"""Writes dashboards/clamp.json, the Grafana dashboard of clamp's /metrics.

Run it again after a route or a metric is added (python3 docker/grafana/dashboard.py); the
JSON it writes is what Grafana loads (provisioning/dashboards/clamp.yml).

clamp names every route's metrics after the route, as Clamp did
(`create_service_request_handler_counter_total{status}`,
`create_service_request_handler_histogram_bucket{le}`, ...): there is no `route` label.
The per-route panels put one on in the query, by joining one
`label_replace(rate(<route's metric>[...]), "route", "<method and path>", "", "")` per
route with `or`. This is exact and needs nothing from the scrape config, so the
dashboard works against any Prometheus that scrapes clamp. ROUTES must follow
`Route::metric_prefix` in src/metrics.rs.
"""

import json
import os

# (metric name prefix, what the route is), in src/metrics.rs's Route::ALL order.
ROUTES = [
    ("create_workflow_request_handler", "POST /workflow"),
    ("get_workflow_handler_by_workflow_name", "GET /workflow/{name}"),
    ("clamp_put_workflow_handler", "PUT /workflow/{name}"),
    ("clamp_workflow_versions_handler", "GET /workflow/{name}/versions"),
    ("get_workflows_handler", "GET /workflows"),
    ("create_service_request_handler", "POST /serviceRequest/{workflow}"),
    ("get_service_request_handler_by_id", "GET /serviceRequest/{id}"),
    ("cancel_service_request_handler", "POST /serviceRequest/{id}/cancel"),
    ("clamp_retry_service_request_handler", "POST /serviceRequest/{id}/retry"),
    ("clamp_retry_service_requests_handler", "POST /serviceRequests/retry"),
    ("clamp_rerun_service_request_handler", "POST /serviceRequest/{id}/rerun"),
    ("get_service_requests_by_workflow_name_handler", "GET /serviceRequests/{workflow}"),
    ("clamp_search_service_requests_handler", "GET /serviceRequests"),
    ("clamp_count_service_requests_handler", "GET /serviceRequestCounts"),
    ("resume_async_service_request_handler", "POST /stepResponse"),
    ("health_handler", "GET /health"),
    ("ready_handler", "GET /ready"),
    ("metrics_handler", "GET /metrics"),
    ("openapi_handler", "GET /openapi.json"),
    ("clamp_console_handler", "/console"),
    ("not_found_handler", "no route (404, 405)"),
]

DS = {"type": "prometheus", "uid": "${datasource}"}
# Every selector is narrowed to the chosen jobs and instances.
SEL = 'job=~"$job", instance=~"$instance"'
RATE = "$__rate_interval"
S5XX = 'status="5xx"'
S4XX = 'status="4xx"'


def sel(extra=""):
    return "{" + (extra + ", " if extra else "") + SEL + "}"


def per_route(expr_of):
    """One series set per route, each with a `route` label, joined with `or`."""
    return "\n  or ".join(
        f'label_replace({expr_of(prefix)}, "route", "{label}", "", "")'
        for prefix, label in ROUTES
    )


def route_requests(extra=""):
    return per_route(lambda p: f"rate({p}_counter_total{sel(extra)}[{RATE}])")


def route_buckets():
    return per_route(lambda p: f"rate({p}_histogram_bucket{sel()}[{RATE}])")


def rate(metric, by=None, extra=""):
    inner = f"rate({metric}{sel(extra)}[{RATE}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantile(q, metric, by=""):
    group = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{sel()}[{RATE}])))"


class Layout:
    """Places panels left to right in rows of 24 columns."""

    def __init__(self):
        self.panels = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        self._newline()
        self.panels.append({
            "type": "row",
            "id": self._id(),
            "title": title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            "panels": [],
        })
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
        self.x = 0
        self.row_h = 0

    def add(self, panel, w, h):
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def targets(queries):
    out = []
    for i, (expr, legend) in enumerate(queries):
        out.append({
            "datasource": DS,
            "editorMode": "code",
            "expr": expr,
            "legendFormat": legend,
            "range": True,
            "refId": chr(ord("A") + i),
        })
    return out


def timeseries(title, description, queries, unit, stack=False, legend_right=False, minimum=0):
    defaults = {
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
        "unit": unit,
    }
    if minimum is not None:
        defaults["min"] = minimum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "showLegend": True,
                "displayMode": "table",
                "placement": "right" if legend_right else "bottom",
                "calcs": ["mean", "max", "lastNotNull"],
                "sortBy": "Max",
                "sortDesc": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets(queries),
    }


def stat(title, description, expr, unit, steps=None, decimals=None):
    defaults = {
        "color": {"mode": "thresholds"},
        "thresholds": {
            "mode": "absolute",
            "steps": steps or [{"color": "green", "value": None}],
        },
        "unit": unit,
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        },
        "targets": targets([(expr, "")]),
    }


def red_above(v):
    return [{"color": "green", "value": None}, {"color": "red", "value": v}]


def panels():
    L = Layout()
    all_requests = f"sum(\n  {route_requests()}\n)"
    requests_5xx = f"sum(\n  {route_requests(S5XX)}\n)"
    requests_4xx = f"sum(\n  {route_requests(S4XX)}\n)"

    L.row("Overview")
    L.add(stat("Instances up", "Scrape targets answering /metrics (`up`).",
               f"sum(up{sel()})", "none",
               [{"color": "red", "value": None}, {"color": "green", "value": 1}]), 4, 4)
    L.add(stat("Requests / s", "Every route's answers (`*_handler*_counter_total`).",
               all_requests, "reqps"), 4, 4)
    L.add(stat("5xx ratio", "5xx answers over all answers, every route.",
               f"{requests_5xx}\n/\n{all_requests}", "percentunit",
               red_above(0.01), 2), 4, 4)
    L.add(stat("Overload 503 / s",
               "Creates answered 503 because the write buffer stayed full or the database "
               "was down (`clamp_rejected_overload_total`).",
               rate("clamp_rejected_overload_total"), "reqps", red_above(0.001)), 4, 4)
    L.add(stat("Write buffer depth", "Rows waiting in the write buffers, all threads "
               "(`clamp_write_buffer_depth`).",
               f"sum(clamp_write_buffer_depth{sel()})", "short"), 4, 4)
    L.add(stat("Step calls in flight", "Step calls in flight to downstream hosts "
               "(`clamp_downstream_in_flight`).",
               f"sum(clamp_downstream_in_flight{sel()})", "short"), 4, 4)

    L.row("HTTP API")
    L.add(timeseries(
        "Requests per route",
        "Answers per second, by route (the `*_handler*_counter_total` of each route).",
        [(f"sum by (route) (\n  {route_requests()}\n)", "{{route}}")],
        "reqps", legend_right=True), 12, 9)
    L.add(timeseries(
        "Requests by status class",
        "Answers per second of every route, by status class (2xx, 4xx, 5xx, other).",
        [(f"sum by (status) (\n  {route_requests()}\n)", "{{status}}")],
        "reqps", stack=True), 12, 9)
    for q in ("0.5", "0.99"):
        L.add(timeseries(
            f"Latency p{int(float(q) * 100)} per route",
            f"The {q} quantile of the seconds to answer, by route (the "
            "`*_handler*_histogram` of each route; buckets 50 µs … 10 s).",
            # `>= 0` drops the NaN of routes without answers in the window.
            [(f"histogram_quantile({q}, sum by (route, le) (\n  {route_buckets()}\n)) >= 0",
              "{{route}}")],
            "s", legend_right=True), 12, 9)
    L.add(timeseries(
        "5xx per route",
        "5xx answers per second, by route. The creates among them include the overload "
        "503s; GET /ready answers 503 while Postgres is unreachable.",
        [(f"sum by (route) (\n  {route_requests(S5XX)}\n)", "{{route}}")],
        "reqps"), 8, 8)
    L.add(timeseries(
        "Error ratio",
        "5xx and 4xx answers over all answers, every route.",
        [(f"{requests_5xx}\n/\n{all_requests}", "5xx"),
         (f"{requests_4xx}\n/\n{all_requests}", "4xx")],
        "percentunit"), 8, 8)
    L.add(timeseries(
        "Overload rejections (503)",
        "Creates answered 503 because the write buffer stayed full for CLAMP_ENQUEUE_WAIT_MS "
        "or the database was down (`clamp_rejected_overload_total`), beside all 5xx answers "
        "to POST /serviceRequest.",
        [(rate("clamp_rejected_overload_total", "instance"), "rejected {{instance}}"),
         (rate("create_service_request_handler_counter_total", "instance", 'status="5xx"'),
          "create 5xx {{instance}}")],
        "reqps"), 8, 8)

    L.row("Service requests")
    L.add(timeseries(
        "Service requests: created, completed, failed, cancelled",
        "Created: 2xx answers to POST /serviceRequest/{workflow} (an idempotent replay "
        "counts too). Completed, failed, cancelled: `completed_` / `failed_` / "
        "`cancelled_service_request_handler_counter_total`. Set aside: requests released "
        "after a transient database error, to be continued later "
        "(`clamp_requests_released_total`).",
        [(rate("create_service_request_handler_counter_total", extra='status="2xx"'),
          "created"),
         (rate("completed_service_request_handler_counter_total"), "completed"),
         (rate("failed_service_request_handler_counter_total"), "failed"),
         (rate("cancelled_service_request_handler_counter_total"), "cancelled"),
         (rate("clamp_requests_released_total"), "set aside")],
        "ops"), 12, 8)
    L.add(timeseries(
        "Status reads by source",
        "GET /serviceRequest/{id} answered from memory, from Postgres, or from the request "
        "row in Postgres and the step rows in memory (`clamp_status_reads_total{source}`).",
        [(rate("clamp_status_reads_total", "source"), "{{source}}")],
        "ops", stack=True), 6, 8)
    L.add(timeseries(
        "Deleted by retention",
        "Finished service requests deleted by the retention policy (CLAMP_RETENTION_DAYS; "
        "`clamp_retention_deleted_total`).",
        [(rate("clamp_retention_deleted_total"), "deleted")],
        "ops"), 6, 8)

    L.row("Steps")
    L.add(timeseries(
        "Steps executed",
        "Step attempts finished (`clamp_steps_executed_total`).",
        [(rate("clamp_steps_executed_total", "instance"), "{{instance}}")],
        "ops"), 8, 8)
    L.add(timeseries(
        "Step retries by cause",
        "Step calls scheduled to be tried again, by the cause of the failed attempt "
        "(connect, broken, timeout, queued, status, broker; `clamp_step_retries_total`).",
        [(rate("clamp_step_retries_total", "cause"), "{{cause}}")],
        "ops", stack=True), 8, 8)
    L.add(timeseries(
        "Step retries exhausted",
        "Steps that failed after using up their attempts "
        "(`clamp_step_retries_exhausted_total`).",
        [(rate("clamp_step_retries_exhausted_total", "instance"), "{{instance}}")],
        "ops"), 8, 8)
    L.row("Downstream and leases")
    L.add(timeseries(
        "Downstream step calls",
        "Step calls in flight to downstream hosts, and those waiting for a free slot "
        "(at most CLAMP_DOWNSTREAM_MAX_IN_FLIGHT per host, 256 by default; the limit "
        "itself is not exported). `clamp_downstream_in_flight`, `clamp_downstream_waiting`.",
        [(f"sum(clamp_downstream_in_flight{sel()})", "in flight"),
         (f"sum(clamp_downstream_waiting{sel()})", "waiting")],
        "short"), 12, 8)
    L.add(timeseries(
        "Leases and sweeper",
        "Service requests claimed by this instance's sweeper (`clamp_leases_claimed_total`) "
        "and writes refused because another instance holds the lease "
        "(`clamp_leases_lost_total`).",
        [(rate("clamp_leases_claimed_total", "instance"), "claimed {{instance}}"),
         (rate("clamp_leases_lost_total", "instance"), "lost {{instance}}")],
        "ops"), 12, 8)

    L.row("Write path")
    L.add(timeseries(
        "Write buffer depth",
        "Rows waiting in the write buffers (`clamp_write_buffer_depth`, the sum of every "
        "thread's buffer). The capacity is not exported: the line is the dashboard "
        "variable buffer_rows, one thread's buffer (CLAMP_BUFFER_ROWS, 8192 by default). "
        "A buffer that stays full makes creates answer 503; the instance holds "
        "buffer_rows × CLAMP_THREADS rows in all.",
        [(f"sum by (instance) (clamp_write_buffer_depth{sel()})", "depth {{instance}}"),
         ("vector($buffer_rows)", "one buffer's capacity")],
        "short"), 12, 8)
    L.add(timeseries(
        "Rows committed and flush errors",
        "Service-request rows committed (`clamp_write_rows_total`) and batch inserts that "
        "failed (`clamp_write_flush_errors_total`).",
        [(rate("clamp_write_rows_total", "instance"), "rows {{instance}}"),
         (rate("clamp_write_flush_errors_total", "instance"), "flush errors {{instance}}")],
        "ops"), 12, 8)
    L.add(timeseries(
        "Batch size",
        "Rows per batch insert (`clamp_write_batch_rows` histogram): the mean, exact, and "
        "the p99, interpolated within buckets of powers of two (batches of one row show "
        "as 0.99).",
        [(f"{rate('clamp_write_batch_rows_sum')}\n/\n{rate('clamp_write_batch_rows_count')}",
          "mean"),
         (quantile("0.99", "clamp_write_batch_rows"), "p99")],
        "short"), 8, 8)
    L.add(timeseries(
        "Batch commit latency",
        "Seconds per batch insert including its commit (`clamp_write_commit_seconds` "
        "histogram).",
        [(quantile("0.5", "clamp_write_commit_seconds"), "p50"),
         (quantile("0.99", "clamp_write_commit_seconds"), "p99")],
        "s"), 8, 8)
    L.add(timeseries(
        "Batches committed",
        "Batch inserts per second (`clamp_write_commit_seconds_count`).",
        [(rate("clamp_write_commit_seconds_count", "instance"), "{{instance}}")],
        "ops"), 8, 8)

    L.row("Brokers")
    L.add(timeseries(
        "Step messages published",
        "Step messages published to a broker, by broker and outcome (sent, failed; "
        "`clamp_broker_published_total`).",
        [(rate("clamp_broker_published_total", "broker, outcome"), "{{broker}} {{outcome}}")],
        "ops"), 12, 8)
    L.add(timeseries(
        "Step responses consumed",
        "Step responses consumed from a broker, by broker and outcome (resumed, duplicate, "
        "malformed, rejected, unavailable; `clamp_broker_replies_total`).",
        [(rate("clamp_broker_replies_total", "broker, outcome"), "{{broker}} {{outcome}}")],
        "ops"), 12, 8)

    L.row("Tracing")
    L.add(timeseries(
        "Trace spans dropped",
        "Finished spans dropped because the export queue was full "
        "(`clamp_trace_spans_dropped_total`; zero while tracing is off).",
        [(rate("clamp_trace_spans_dropped_total", "instance"), "dropped {{instance}}")],
        "ops"), 12, 8)
    L.add(timeseries(
        "Trace spans exported and failed",
        "Finished spans exported to the OTLP endpoint (`clamp_trace_spans_exported_total`) "
        "and lost because their export failed (`clamp_trace_spans_failed_total`).",
        [(rate("clamp_trace_spans_exported_total", "instance"), "exported {{instance}}"),
         (rate("clamp_trace_spans_failed_total", "instance"), "failed {{instance}}")],
        "ops"), 12, 8)
    return L.panels


def query_variable(name, label, query):
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "definition": query,
        "query": query,
        "refresh": 2,
        # No custom all value: "All" is the values found, so that a Prometheus that
        # scrapes more than clamp (its own job, here) does not add them to `up`.
        "includeAll": True,
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def dashboard():
    return {
        "id": None,
        "uid": "clamp",
        "title": "clamp",
        "description": "clamp's /metrics: HTTP API, service requests, steps, write path, "
                       "brokers, tracing. Generated by docker/grafana/dashboard.py.",
        "tags": ["clamp"],
        "editable": True,
        "graphTooltip": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "weekStart": "",
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "templating": {"list": [
            {
                "type": "datasource",
                "name": "datasource",
                "label": "Data source",
                "query": "prometheus",
                "current": {"selected": False, "text": "Prometheus", "value": "prometheus"},
                "options": [],
                "refresh": 1,
                "regex": "",
                "hide": 0,
                "includeAll": False,
                "multi": False,
            },
            query_variable("job", "Job", "label_values(clamp_write_buffer_depth, job)"),
            query_variable("instance", "Instance",
                           'label_values(clamp_write_buffer_depth{job=~"$job"}, instance)'),
            {
                "type": "textbox",
                "name": "buffer_rows",
                "label": "Rows per write buffer (CLAMP_BUFFER_ROWS)",
                "description": "The capacity of one thread's write buffer; clamp does not "
                               "export it.",
                "query": "8192",
                "current": {"selected": False, "text": "8192", "value": "8192"},
                "options": [{"selected": True, "text": "8192", "value": "8192"}],
                "hide": 0,
            },
        ]},
        "panels": panels(),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "dashboards", "clamp.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dashboard(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()
