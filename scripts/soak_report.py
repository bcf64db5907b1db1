#!/usr/bin/env python3
"""The record of a soak (scripts/bench-soak.sh): per window, completed/s and server +
Postgres CPU per completed request from the samples, the tables' size, dead tuples and
vacuum runs; the first and last five minutes compared; a plot (soak.svg) of rate and CPU
per request against time, and of both against the tables' size.

Reads $SK_OUT/samples.csv and the SK_* variables the script exports; writes
$SK_OUT/README.md and $SK_OUT/soak.svg. The arithmetic is `windows` and `summary`, tested
in scripts/test_benchmath.py.
"""

import csv
import os
import re
import sys
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmath import cpu_per, median, ratio  # noqa: E402


def windows(rows):
    """One dict per window between consecutive samples: minute, completed/s, CPU µs per
    completed request (server, Postgres, both), GB at its end, dead tuples at its end,
    vacuum runs in it, partitions at its end, requests dropped by retention in it."""
    out = []
    for a, b in zip(rows, rows[1:]):
        dt = float(b["t"]) - float(a["t"])
        done = int(b["completed"]) - int(a["completed"])
        srv = int(b["server_ticks"]) - int(a["server_ticks"])
        pg = int(b["pg_ticks"]) - int(a["pg_ticks"])
        out.append({
            "minute": int(b["minute"]),
            "rate": ratio(done, dt),
            "server_us": cpu_per(srv, done),
            "pg_us": cpu_per(pg, done),
            "cpu_us": cpu_per(srv + pg, done),
            "gb": int(b["bytes"]) / 1e9,
            "dead": int(b["dead"]),
            "vacuums": int(b["vacuums"]) - int(a["vacuums"]),
            "partitions": int(b["partitions"]),
            "dropped": int(b["dropped"]) - int(a["dropped"]),
            "wal_per": ratio(int(b["wal"]) - int(a["wal"]), done),
        })
    return out


AUTO_START = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (\w+) \[\d+\] LOG:  '
                        r'automatic (vacuum|analyze) of table "(?:[^".]+\.)*([^".]+)"')
# A partition set's suffix at the end of a partition's name (`_p20261206t031500`, `_p0`).
SET_SUFFIX = re.compile(r"_p(\d{8}t\d{6}|0)$")
AUTO_USAGE = re.compile(r'system usage: CPU: user: ([\d.]+) s, system: ([\d.]+) s, elapsed: ([\d.]+) s')


def autovacuum_runs(lines):
    """The autovacuum and autoanalyze runs a Postgres log holds (log_autovacuum_min_duration
    = 0, log_timezone UTC, the default line prefix '%m [%p] '): (epoch seconds at its end, 'vacuum' or
    'analyze', table, CPU seconds, elapsed seconds), in the log's order."""
    runs, cur = [], None
    for line in lines:
        m = AUTO_START.match(line)
        if m:
            # The soak's cluster logs in UTC (log_timezone).
            whole, _, frac = m.group(1).partition(".")
            stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
            t = stamp.timestamp() + float("0." + (frac or "0"))
            cur = (t, m.group(3), m.group(4))
            continue
        u = AUTO_USAGE.search(line)
        if u and cur:
            runs.append((*cur, float(u.group(1)) + float(u.group(2)), float(u.group(3))))
            cur = None
    return runs


def partition_role(table, t, starts):
    """'in use' when `table` is the partition of the latest set begun by time `t` among the
    set starts seen (`starts`: epoch seconds by suffix), 'left' when a later set had begun,
    'table' for a table that is not a set's partition (or the first set, `_p0`, once a
    later one began: 'left')."""
    m = SET_SUFFIX.search(table)
    if not m:
        return "table"
    mine = starts.get(m.group(1), 0.0)
    return "left" if any(mine < s <= t for s in starts.values()) else "in use"


def set_start(suffix):
    """Epoch seconds a set's suffix names (the first set, `0`: the beginning of time)."""
    if suffix == "0":
        return 0.0
    return datetime.strptime(suffix, "%Y%m%dt%H%M%S").replace(
        tzinfo=timezone.utc).timestamp()


def autovacuum_by_window(runs, ws, rows):
    """Adds to each window the autovacuum CPU µs per completed request in it, and returns
    the totals per (kind, table family, role): runs, CPU s, elapsed s."""
    starts = {}
    for _, _, table, _, _ in runs:
        m = SET_SUFFIX.search(table)
        if m:
            starts[m.group(1)] = set_start(m.group(1))
    totals = {}
    for w, (a, b) in zip(ws, zip(rows, rows[1:])):
        t0, t1 = float(a["t"]), float(b["t"])
        done = int(b["completed"]) - int(a["completed"])
        cpu = sum(r[3] for r in runs if t0 < r[0] <= t1)
        w["vacuum_us"] = cpu * 1e6 / done if done else float("nan")
    for t, kind, table, cpu, elapsed in runs:
        family = SET_SUFFIX.sub("", table)
        key = (kind, family, partition_role(table, t, starts))
        n, c, e = totals.get(key, (0, 0.0, 0.0))
        totals[key] = (n + 1, c + cpu, e + elapsed)
    return totals


def summary(ws, n=5, flat_after=10):
    """First and last `n` windows' median rate and CPU, their ratios, and the size's
    spread (max ÷ min) over the windows after the first `flat_after` minutes (issue 45's
    "flat after the first 10 minutes": the window ending at minute 10 is not after)."""
    first, last = ws[:n], ws[-n:]
    f_rate = median(w["rate"] for w in first)
    l_rate = median(w["rate"] for w in last)
    f_cpu = median(w["cpu_us"] for w in first)
    l_cpu = median(w["cpu_us"] for w in last)
    later = [w["gb"] for w in ws if w["minute"] > flat_after]
    spread = max(later) / min(later) if later and min(later) > 0 else float("nan")
    return {
        "first_rate": f_rate, "last_rate": l_rate, "rate_ratio": ratio(l_rate, f_rate),
        "first_cpu": f_cpu, "last_cpu": l_cpu, "cpu_ratio": ratio(l_cpu, f_cpu),
        "size_spread": spread,
    }


def svg(ws, title):
    """Three panels: completed/s and CPU µs per request against minutes, and both against
    the tables' size in GB."""
    W, H, pad = 900, 260, 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{3 * H + 40}" '
             f'font-family="sans-serif" font-size="12">',
             f'<text x="{pad}" y="20" font-size="14">{title}</text>']

    def panel(y0, xs, series, xlabel):
        xmin, xmax = min(xs), max(xs)
        xmax = xmax if xmax > xmin else xmin + 1
        x = lambda v: pad + (v - xmin) / (xmax - xmin) * (W - 2 * pad)
        parts.append(f'<rect x="{pad}" y="{y0}" width="{W - 2 * pad}" height="{H - 60}" '
                     f'fill="none" stroke="#999"/>')
        parts.append(f'<text x="{W / 2}" y="{y0 + H - 30}" text-anchor="middle">{xlabel}</text>')
        for i in range(6):
            v = xmin + (xmax - xmin) * i / 5
            parts.append(f'<text x="{x(v)}" y="{y0 + H - 45}" text-anchor="middle">{v:.3g}</text>')
        for k, (name, ys, color, side) in enumerate(series):
            good = [y for y in ys if y == y]
            if not good:
                continue
            ymax = max(good) * 1.1 or 1
            y = lambda v: y0 + (H - 60) - v / ymax * (H - 60)
            pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(xs, ys) if b == b)
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
            lx = pad - 50 if side == "left" else W - pad + 5
            for i in range(3):
                v = ymax * i / 2
                parts.append(f'<text x="{lx}" y="{y(v) + 4}" fill="{color}">{v:,.0f}</text>')
            parts.append(f'<text x="{pad + 10 + 260 * k}" y="{y0 + 15}" fill="{color}">{name}</text>')

    minutes = [w["minute"] for w in ws]
    rate = [w["rate"] for w in ws]
    cpu = [w["cpu_us"] for w in ws]
    gb = [w["gb"] for w in ws]
    panel(40, minutes, [("completed/s", rate, "#1f77b4", "left"),
                        ("server + Postgres µs per request", cpu, "#d62728", "right")], "minute")
    panel(40 + H, minutes, [("tables' size, GB", gb, "#2ca02c", "left"),
                            ("dead tuples", [w["dead"] for w in ws], "#9467bd", "right")], "minute")
    order = sorted(range(len(ws)), key=lambda i: gb[i])
    panel(40 + 2 * H, [gb[i] for i in order],
          [("completed/s", [rate[i] for i in order], "#1f77b4", "left"),
           ("µs per request", [cpu[i] for i in order], "#d62728", "right")], "tables' size, GB")
    parts.append("</svg>")
    return "\n".join(parts)


def accounting(acknowledged, seeded, left, dropped, conns):
    """Every acknowledged (and seeded) request is still in the tables or was dropped by
    retention. The tables may hold a few more: requests committed whose answer the load
    generator, stopping, did not wait for (at most one per connection)."""
    kept = left + dropped
    extra = kept - acknowledged - seeded
    verdict = ("every acknowledged request accounted for" if 0 <= extra <= conns
               else "MISMATCH: " + ("acknowledged requests missing" if extra < 0
                                    else "more rows than requests written"))
    return (f"Acknowledged and seeded ≤ left + dropped: {acknowledged + seeded:,} ≤ {kept:,}, "
            f"{extra:,} committed whose answer the stopping load did not read (at most {conns}, "
            f"its connections): {verdict}.")


def main():
    E = os.environ
    out = E["SK_OUT"]
    rows = list(csv.DictReader(open(f"{out}/samples.csv")))
    ws = windows(rows)
    s = summary(ws)
    runs = []
    if os.path.exists(f"{out}/autovacuum.csv"):
        runs = [(float(r["t"]), r["kind"], r["table"], float(r["cpu_s"]), float(r["elapsed_s"]))
                for r in csv.DictReader(open(f"{out}/autovacuum.csv"))]
    totals = autovacuum_by_window(runs, ws, rows)
    with open(f"{out}/soak.svg", "w") as f:
        f.write(svg(ws, f"{E['SK_TAG']} at {E['SK_GIT']}: rate and CPU per request against time and size"))
    created, completed, dropped = int(E["SK_CREATED"]), int(E["SK_COMPLETED"]), int(E["SK_DROPPED"])
    rows_left, open_rows = int(E["SK_ROWS"]), int(E["SK_OPEN"])
    seeded_left = int(E["SK_SEEDED_LEFT"])
    lines = [
        f"# Soak: {E['SK_TAG']}",
        "",
        f"- machine: {E['SK_MACHINE']}",
        f"- commit: {E['SK_GIT']}; binary {E['SK_BIN']}",
        f"- command: `scripts/bench-soak.sh` with BIN={E['SK_BIN']} MINUTES={E['SK_MINUTES']} "
        f"WINDOW={E['SK_WINDOW']} SEED={E['SK_SEED']}",
        f"- server: `{E['SK_SERVER']}`",
        f"- load: `{E['SK_WRK']}` (the two-step workflow against nginx's fixed 200)",
        f"- Postgres: `{E['SK_PGCMD']}` (the README's), {E['SK_PG']}",
        f"- seeded: {E['SK_SEED']} finished requests before the start"
        + (f" (in {E['SK_SEED_SECS']} s)" if int(E['SK_SEED']) else ""),
        "",
        "## Summary",
        "",
        "| | first 5 min | last 5 min | last ÷ first |",
        "|---|---|---|---|",
        f"| completed/s (median of the windows) | {s['first_rate']:,.0f} | {s['last_rate']:,.0f} | **{s['rate_ratio']:.3f}** |",
        f"| server + Postgres CPU µs per completed request | {s['first_cpu']:.1f} | {s['last_cpu']:.1f} | **{s['cpu_ratio']:.3f}** |",
        "",
        f"Tables' size after the first 10 minutes: max ÷ min = {s['size_spread']:.3f}; at the end "
        f"{ws[-1]['gb']:.2f} GB, {ws[-1]['partitions']} request partitions attached.",
        "",
        f"Requests: {created:,} acknowledged (answered 2xx), {completed:,} finished ({E['SK_FAILED']} failed); "
        f"at the end {rows_left:,} rows of the workflow in the table ({seeded_left:,} of them seeded), "
        f"{open_rows:,} of them unfinished; {dropped:,} dropped by retention. "
        + accounting(created, int(E["SK_SEED"]), rows_left, dropped, int(E.get("SK_CONNS", "0"))),
        "",
        "![rate and CPU per request](soak.svg)",
        "",
        "## Windows",
        "",
        "| minute | completed/s | server µs | Postgres µs | of which autovacuum µs | total µs | WAL B/req | GB | dead tuples | vacuum runs | partitions | dropped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in ws:
        lines.append(f"| {w['minute']} | {w['rate']:,.0f} | {w['server_us']:.1f} | {w['pg_us']:.1f} | "
                     f"{w['vacuum_us']:.1f} | "
                     f"{w['cpu_us']:.1f} | {w['wal_per']:,.0f} | {w['gb']:.2f} | {w['dead']:,} | "
                     f"{w['vacuums']} | {w['partitions']} | {w['dropped']:,} |")
    if totals:
        lines += ["", "## Autovacuum", "",
                  "Every autovacuum and autoanalyze run of the soak, from the cluster's log "
                  "(`log_autovacuum_min_duration = 0`): per table (partitions together), and "
                  "whether the partition was the set taking the traffic or one left behind when "
                  "the run ended. The whole list: [autovacuum.csv](autovacuum.csv).", "",
                  "| run | table | partition | runs | CPU s | elapsed s |", "|---|---|---|---|---|---|"]
        for (kind, family, role), (n, c, e) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"| {kind} | {family} | {role} | {n} | {c:.1f} | {e:.1f} |")
    lines += ["", "Samples: [samples.csv](samples.csv); wrk's output: [wrk.txt](wrk.txt); the "
              "server's log lines about partitions and retention: [server-log-excerpt.txt](server-log-excerpt.txt).", ""]
    with open(f"{out}/README.md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines[11:17]))


if __name__ == "__main__":
    if sys.argv[1:] == ["autovacuum"]:
        # The runs of a Postgres log on stdin, as CSV on stdout (the script's autovacuum.csv).
        out = csv.writer(sys.stdout)
        out.writerow(["t", "kind", "table", "cpu_s", "elapsed_s"])
        for r in autovacuum_runs(sys.stdin):
            out.writerow([f"{r[0]:.3f}", r[1], r[2], f"{r[3]:.2f}", f"{r[4]:.2f}"])
    else:
        main()
