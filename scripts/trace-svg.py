#!/usr/bin/env python3
"""Draws one trace from a spans file as a waterfall picture (a standalone SVG).

The spans file is JSON lines, one span a line, as tests/otlp/receiver.py writes them
(`traceId`, `spanId`, `parentSpanId`, `name`, `kind`, `startTimeUnixNano`,
`endTimeUnixNano`, `attributes`, `events`, `links`, `status`, `resource`, `scope`).
One row per span in tree order (children under their parent, indented, by start time),
a time axis in ms from the trace's first start, a bar per span coloured by its kind,
its name and duration as text, events as diamonds on the bar with their names, links
as arrows to a span of the same trace or noted as text when they point elsewhere, and
errors outlined in red. Hovering a row in a browser shows its ids and attributes.
Standard library only.

    scripts/trace-svg.py spans.jsonl --out trace.svg                 # the trace with the most spans
    scripts/trace-svg.py spans.jsonl --trace 5b8efff7 --out trace.svg  # a trace id or a unique prefix
"""
import argparse
import datetime
import json
import math
import sys
from collections import Counter, defaultdict
from xml.sax.saxutils import escape

WIDTH = 1000
PAD = 16
LABEL_W = 330  # the span-name column
CHART_X0 = PAD + LABEL_W + 12
CHART_X1 = WIDTH - PAD - 40
ROW_H = 32
TOP = 112  # the first row's top; the title, legend and axis are above it
INDENT = 16
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
KINDS = [  # (kind, legend label, bar colour)
    ("SPAN_KIND_SERVER", "server", "#4c78a8"),
    ("SPAN_KIND_CLIENT", "client", "#f58518"),
    ("SPAN_KIND_INTERNAL", "internal", "#54a24b"),
    ("SPAN_KIND_PRODUCER", "producer", "#b279a2"),
    ("SPAN_KIND_CONSUMER", "consumer", "#72b7b2"),
    ("SPAN_KIND_UNSPECIFIED", "unspecified", "#9d9d9d"),
]
COLOUR = {k: c for k, _, c in KINDS}
ERROR = "#d1242f"
INK, GREY, LINK = "#1f2328", "#57606a", "#6e7781"


def text_w(s, size):
    return len(s) * size * 0.6  # a generous average advance for the sans fonts above


def fit(s, size, width):
    if text_w(s, size) <= width:
        return s
    n = max(1, int(width / (size * 0.6)) - 1)
    return s[:n] + "…"


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def fmt_ms(ms):
    if ms >= 1000:
        return f"{ms / 1000:.3g} s" if ms < 10000 else f"{ms / 1000:.1f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms * 1000:.3g} µs"


def nice_step(span_ms, ticks=8):
    raw = span_ms / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def load(path):
    spans = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    spans.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not a JSON line: {e}")
    return spans


def pick_trace(spans, wanted):
    counts = Counter(s["traceId"] for s in spans)
    if not counts:
        sys.exit("no spans in the file")
    if wanted is None:
        return counts.most_common(1)[0][0]
    matches = [t for t in counts if t.startswith(wanted.lower())]
    if len(matches) != 1:
        sys.exit(f"--trace {wanted}: {'no' if not matches else 'more than one'} trace matches "
                 f"(traces: {', '.join(f'{t} ({n} spans)' for t, n in counts.most_common(10))})")
    return matches[0]


def tree_order(spans):
    """(span, depth) in tree order: each span followed by its children, by start time."""
    by_id = {}
    for s in spans:
        by_id.setdefault(s["spanId"], s)  # a span exported twice is drawn once
    children = defaultdict(list)
    roots = []
    for s in by_id.values():
        parent = s.get("parentSpanId") or ""
        (children[parent] if parent in by_id and parent != s["spanId"] else roots).append(s)
    order, seen = [], set()

    def walk(s, depth):
        if s["spanId"] in seen:
            return
        seen.add(s["spanId"])
        order.append((s, depth))
        for c in sorted(children[s["spanId"]], key=lambda c: c["startTimeUnixNano"]):
            walk(c, depth + 1)

    for r in sorted(roots, key=lambda s: s["startTimeUnixNano"]):
        walk(r, 0)
    return order


def tooltip(s, t0):
    lines = [
        f"{s['name']}  ({s['kind'].removeprefix('SPAN_KIND_').lower()})",
        f"span {s['spanId']}  parent {s.get('parentSpanId') or '-'}",
        f"{fmt_ms((s['startTimeUnixNano'] - t0) / 1e6)} → {fmt_ms((s['endTimeUnixNano'] - t0) / 1e6)}"
        f"  ({fmt_ms((s['endTimeUnixNano'] - s['startTimeUnixNano']) / 1e6)})",
    ]
    status = s.get("status") or {}
    if status.get("code", "STATUS_CODE_UNSET") != "STATUS_CODE_UNSET":
        lines.append(f"status {status['code'].removeprefix('STATUS_CODE_')} {status.get('message', '')}".rstrip())
    lines += [f"{k} = {json.dumps(v)}" for k, v in (s.get("attributes") or {}).items()]
    for e in s.get("events") or []:
        attrs = ", ".join(f"{k}={json.dumps(v)}" for k, v in (e.get("attributes") or {}).items())
        lines.append(f"event {e['name']} at {fmt_ms((e['timeUnixNano'] - t0) / 1e6)} {attrs}".rstrip())
    for link in s.get("links") or []:
        lines.append(f"link → trace {link['traceId']} span {link['spanId']}")
    if s.get("scope"):
        lines.append(f"scope {s['scope']}")
    return escape("\n".join(lines))


class Chart:
    """The trace's time scale: ns since the epoch to x in the bar area, and the axis ticks."""

    def __init__(self, rows):
        self.t0 = min(s["startTimeUnixNano"] for s, _ in rows)
        self.total_ms = (max(end_ns(s) for s, _ in rows) - self.t0) / 1e6
        self.step = nice_step(self.total_ms if self.total_ms > 0 else 1.0)
        self.domain_ms = max(self.step, math.ceil(self.total_ms / self.step - 1e-9) * self.step)

    def x_ms(self, ms):
        return CHART_X0 + ms / self.domain_ms * (CHART_X1 - CHART_X0)

    def x(self, ns):
        return self.x_ms((ns - self.t0) / 1e6)


def end_ns(s):
    return max(s["endTimeUnixNano"], s["startTimeUnixNano"])


def row_mid(i):
    """The vertical centre of row i's bar."""
    return TOP + i * ROW_H + ROW_H / 2 + 4


def header(trace_id, title, rows, chart):
    services = sorted({str((s.get("resource") or {}).get("service.name", "?")) for s, _ in rows})
    start = datetime.datetime.fromtimestamp(chart.t0 / 1e9, datetime.timezone.utc)
    started = f"{start:%Y-%m-%d %H:%M:%S}.{start.microsecond // 1000:03d} UTC"
    yield f'<text x="{PAD}" y="28" font-size="17" font-weight="bold" fill="{INK}">{escape(title)}</text>'
    yield (f'<text x="{PAD}" y="48" fill="{GREY}">trace {trace_id} · service {escape(", ".join(services))} · '
           f'{plural(len(rows), "span")} · {fmt_ms(chart.total_ms)} · started {started}</text>')
    # the legend: the kinds (consumer and unspecified only when there are some), then the marks
    kinds = {s["kind"] for s, _ in rows}
    lx = PAD
    for kind, label, colour in KINDS:
        if kind in ("SPAN_KIND_CONSUMER", "SPAN_KIND_UNSPECIFIED") and kind not in kinds:
            continue
        yield f'<rect x="{lx}" y="62" width="14" height="10" rx="2" fill="{colour}"/>'
        yield f'<text x="{lx + 19}" y="71" fill="{INK}">{label}</text>'
        lx += 19 + text_w(label, 12) + 16
    yield diamond(lx + 6, 67)
    yield f'<text x="{lx + 17}" y="71" fill="{INK}">event</text>'
    lx += 17 + text_w("event", 12) + 16
    yield f'<path d="M{lx},67 h22" stroke="{LINK}" stroke-dasharray="4 3" marker-end="url(#arrow)"/>'
    yield f'<text x="{lx + 28}" y="71" fill="{INK}">link</text>'
    lx += 28 + text_w("link", 12) + 16
    yield f'<rect x="{lx}" y="62" width="14" height="10" rx="2" fill="#fff" stroke="{ERROR}" stroke-width="2"/>'
    yield f'<text x="{lx + 19}" y="71" fill="{INK}">error</text>'


def grid(rows, chart, height):
    """Row stripes, the time axis and its grid lines."""
    for i in range(0, len(rows), 2):
        yield f'<rect x="0" y="{TOP + i * ROW_H}" width="{WIDTH}" height="{ROW_H}" fill="#f6f8fa"/>'
    axis_y = TOP - 8
    yield f'<line x1="{CHART_X0}" y1="{axis_y}" x2="{CHART_X1}" y2="{axis_y}" stroke="#8c959f"/>'
    yield f'<text x="{PAD + 6}" y="{axis_y - 8}" font-size="11" fill="{GREY}">span</text>'
    decimals = max(0, -math.floor(math.log10(chart.step)))
    n_ticks = round(chart.domain_ms / chart.step)
    for k in range(n_ticks + 1):
        ms, tx = k * chart.step, chart.x_ms(k * chart.step)
        unit = " ms" if k == n_ticks else ""
        yield f'<line x1="{tx:.1f}" y1="{axis_y - 4}" x2="{tx:.1f}" y2="{height - 14}" stroke="#d0d7de"/>'
        yield (f'<text x="{tx:.1f}" y="{axis_y - 8}" text-anchor="middle" font-size="11" '
               f'fill="{GREY}">{ms:.{decimals}f}{unit}</text>')


def tree_guides(rows, row_of):
    """An elbow from each parent's name down to each of its children's."""
    depth_of = {s["spanId"]: d for s, d in rows}
    for i, (s, d) in enumerate(rows):
        p = s.get("parentSpanId")
        if d > 0 and p in row_of:
            gx = PAD + 6 + depth_of[p] * INDENT + 4
            yield (f'<path d="M{gx},{row_mid(row_of[p]) + 3} V{row_mid(i) - 2} H{gx + INDENT - 6}" '
                   f'fill="none" stroke="#afb8c1"/>')


def diamond(cx, cy):
    return (f'<path d="M{cx:.1f},{cy - 6} l6,6 l-6,6 l-6,-6 z" fill="#fff" stroke="{INK}" '
            f'stroke-width="1.3"/>')


def span_row(i, s, depth, chart, row_of):
    """Row i: the name, the bar, its events, and a note (duration, error, links)."""
    mid = row_mid(i)
    colour = COLOUR.get(s["kind"], COLOUR["SPAN_KIND_UNSPECIFIED"])
    status = s.get("status") or {}
    error = status.get("code") == "STATUS_CODE_ERROR"
    bx0 = chart.x(s["startTimeUnixNano"])
    bx1 = max(chart.x(end_ns(s)), bx0 + 2)
    yield f'<g><title>{tooltip(s, chart.t0)}</title>'
    yield f'<rect x="0" y="{TOP + i * ROW_H}" width="{WIDTH}" height="{ROW_H}" fill="transparent"/>'
    name_x = PAD + 6 + depth * INDENT
    name = fit(s["name"], 12.5, PAD + LABEL_W - name_x)
    yield f'<text x="{name_x}" y="{mid + 4.5}" font-size="12.5" fill="{INK}">{escape(name)}</text>'
    outline = f' stroke="{ERROR}" stroke-width="2"' if error else ""
    yield (f'<rect x="{bx0:.1f}" y="{mid - 7}" width="{bx1 - bx0:.1f}" height="14" rx="3" '
           f'fill="{colour}"{outline}/>')
    after = bx1 + 6  # where the note may start: past the bar and the diamonds on it
    for e in s.get("events") or []:
        ex = chart.x(e["timeUnixNano"])
        after = max(after, ex + 12)
        yield diamond(ex, mid)
        yield (f'<text x="{ex:.1f}" y="{mid - 9}" text-anchor="middle" font-size="10" '
               f'fill="{INK}">{escape(e["name"])}</text>')
    note = fmt_ms((end_ns(s) - s["startTimeUnixNano"]) / 1e6)
    if error:
        note += " · error" + (f": {status['message']}" if status.get("message") else "")
    for link in s.get("links") or []:
        j = row_of.get(link["spanId"]) if link["traceId"] == s["traceId"] else None
        if j is not None:
            note += " · link ↑" if j < i else " · link ↓"
        else:
            note += f" · link → {link['traceId'][:8]}…/{link['spanId'][:8]}"
    # right of the bar, else inside it, else left of it, else shortened on the right
    fill = ERROR if error else "#424a53"
    halo = ' stroke="#fff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'
    width = text_w(note, 11)
    if after + width <= WIDTH - PAD:
        nx, anchor = after, "start"
    elif bx1 - bx0 >= width + 14:
        nx, anchor, fill, halo = bx1 - 7, "end", "#fff", ""
    elif bx0 - 6 - width >= CHART_X0:
        nx, anchor = bx0 - 6, "end"
    else:
        nx, anchor, note = after, "start", fit(note, 11, WIDTH - PAD - after)
    yield (f'<text x="{nx:.1f}" y="{mid + 4}" text-anchor="{anchor}" font-size="11" '
           f'fill="{fill}"{halo}>{escape(note)}</text>')
    yield "</g>"


def link_arrows(rows, chart, row_of):
    """A dashed arrow from each span to a span of the same trace it links to."""
    def near_start(s):  # a point on the bar a little past its start
        x0 = chart.x(s["startTimeUnixNano"])
        return x0 + min(10, max(chart.x(end_ns(s)) - x0, 2) / 2)

    for i, (s, _) in enumerate(rows):
        for link in s.get("links") or []:
            j = row_of.get(link["spanId"]) if link["traceId"] == s["traceId"] else None
            if j is None or j == i:
                continue
            up = j < i
            sx, tx = near_start(s), near_start(rows[j][0])
            y1, y2 = row_mid(i) + (-7 if up else 7), row_mid(j) + (7 if up else -7)
            bend = (y2 - y1) / 2
            yield (f'<path d="M{sx:.1f},{y1} C{sx:.1f},{y1 + bend:.1f} {tx:.1f},{y2 - bend:.1f} '
                   f'{tx:.1f},{y2}" fill="none" stroke="{LINK}" stroke-width="1.3" '
                   f'stroke-dasharray="4 3" marker-end="url(#arrow)"/>')


def draw(trace_id, spans, title):
    rows = tree_order(spans)
    chart = Chart(rows)
    row_of = {s["spanId"]: i for i, (s, _) in enumerate(rows)}
    height = TOP + len(rows) * ROW_H + 18
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="{FONT}" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
        f'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{LINK}"/></marker></defs>',
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
        *header(trace_id, title, rows, chart),
        *grid(rows, chart, height),
        *tree_guides(rows, row_of),
        *link_arrows(rows, chart, row_of),  # under the bars and their text
        *(line for i, (s, d) in enumerate(rows) for line in span_row(i, s, d, chart, row_of)),
        "</svg>",
    ]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spans", help="spans JSON-lines file (tests/otlp/receiver.py --out)")
    p.add_argument("--trace", help="trace id or a unique prefix (default: the trace with the most spans)")
    p.add_argument("--out", required=True, help="SVG file to write")
    p.add_argument("--title", help="heading (default: the first root span's name)")
    args = p.parse_args()
    spans = load(args.spans)
    trace_id = pick_trace(spans, args.trace)
    mine = [s for s in spans if s["traceId"] == trace_id]
    title = args.title or tree_order(mine)[0][0]["name"]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(draw(trace_id, mine, title))
    print(f"{args.out}: trace {trace_id}, {plural(len(tree_order(mine)), 'span')}", file=sys.stderr)


if __name__ == "__main__":
    main()
