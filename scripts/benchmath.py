#!/usr/bin/env python3
"""The arithmetic of the bench scripts, in one tested place (scripts/test_benchmath.py).

The scripts call it from the shell through scripts/bench-lib.sh (`bm SUBCOMMAND ...`), and
their Python report writers import it (`sys.path.insert(0, "scripts"); import benchmath`).
CPU figures come from /proc ticks, 1/100 s each.

    benchmath.py median 3 1 2                  # 2 (numbers as arguments, else one per line on stdin)
    benchmath.py ratio 21016 74125 --fmt .2f   # 0.28
    benchmath.py cpu-per 150 60000 --fmt .1f   # 25.0: µs of CPU per item, 150 ticks over 60,000 items
    benchmath.py cores 150 6 --fmt .2f         # 0.25: cores busy, 150 ticks over 6 s
    benchmath.py rate 100 2100 0.0 4.0         # 500: per second, counts 100 → 2100 between t 0 and 4 s
    benchmath.py elapsed 1.25 3.5 --fmt .1f    # 2.2: seconds between two `date +%s.%N` readings
    benchmath.py p90 5 1 4 2 3                 # the nearest-rank-below p90 the scripts report
    benchmath.py json FILE achieved_rate       # a field of clamp-bench's --json (dots go deeper: e2e.completed_rate)
    benchmath.py wrk FILE                      # wrk's Requests/sec, its non-2xx count and its p99 ("-" if absent)

Every subcommand prints one value formatted with --fmt (a format spec, default `g`);
`wrk` prints its three fields on one line. A ratio, a per-item figure or a median without
its inputs (a zero divisor, no numbers) prints `nan` and exits 0, so a report still gets
written; a malformed number exits 2.
"""

import argparse
import json
import math
import re
import statistics
import sys

TICKS_PER_SECOND = 100


def median(xs):
    """The median of the numbers (the mean of the middle two for an even count); nan if none."""
    xs = [float(x) for x in xs]
    return statistics.median(xs) if xs else math.nan


def ratio(a, b):
    """a ÷ b; nan when b is 0."""
    a, b = float(a), float(b)
    return a / b if b else math.nan


def cpu_per(ticks, count):
    """Microseconds of CPU per item: `ticks` /proc ticks spent over `count` items."""
    ticks, count = float(ticks), float(count)
    return ticks * 1e6 / TICKS_PER_SECOND / count if count else math.nan


def cores(ticks, seconds):
    """Cores kept busy: `ticks` /proc ticks spent over `seconds` seconds."""
    ticks, seconds = float(ticks), float(seconds)
    return ticks / TICKS_PER_SECOND / seconds if seconds else math.nan


def rate(count0, count1, t0, t1):
    """Items per second between two readings of a counter at times t0 and t1 (seconds)."""
    dt = float(t1) - float(t0)
    return (float(count1) - float(count0)) / dt if dt else math.nan


def p90(xs):
    """The 90th percentile as the scripts have always reported it: of the sorted values, the
    one at index int(n × 0.9) − 1 (the lowest for fewer than two); nan if none."""
    xs = sorted(float(x) for x in xs)
    if not xs:
        return math.nan
    return xs[max(0, int(len(xs) * 0.9) - 1)]


def json_field(path, key):
    """A field of a JSON file; `a.b` reads field b of object a."""
    with open(path) as f:
        value = json.load(f)
    for part in key.split("."):
        value = value[part]
    return value


def wrk(text):
    """From wrk's output: (requests per second, non-2xx/3xx responses, p99 text or None)."""
    rate_m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    p99_m = re.search(r"\s99%\s+(\S+)", text)
    return (float(rate_m.group(1)) if rate_m else math.nan,
            int(non2xx.group(1)) if non2xx else 0,
            p99_m.group(1) if p99_m else None)


def fmt(value, spec):
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


def main(argv=None):
    p = argparse.ArgumentParser(prog="benchmath.py", description=__doc__.splitlines()[0])
    p.add_argument("--fmt", default="g", help="format spec of the printed value (default g)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("median", "p90"):
        s = sub.add_parser(name)
        s.add_argument("numbers", nargs="*")
    s = sub.add_parser("ratio"); s.add_argument("a"); s.add_argument("b")
    s = sub.add_parser("cpu-per"); s.add_argument("ticks"); s.add_argument("count")
    s = sub.add_parser("cores"); s.add_argument("ticks"); s.add_argument("seconds")
    s = sub.add_parser("rate")
    for a in ("count0", "count1", "t0", "t1"):
        s.add_argument(a)
    s = sub.add_parser("elapsed"); s.add_argument("t0"); s.add_argument("t1")
    s = sub.add_parser("json"); s.add_argument("file"); s.add_argument("key")
    s = sub.add_parser("wrk"); s.add_argument("file")
    # The format spec may stand anywhere on the line (before or after the subcommand).
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = "g"
    if "--fmt" in argv:
        i = argv.index("--fmt")
        spec = argv[i + 1]
        del argv[i:i + 2]
    args = p.parse_args(argv)
    try:
        if args.cmd in ("median", "p90"):
            nums = args.numbers or sys.stdin.read().split()
            out = fmt((median if args.cmd == "median" else p90)(nums), spec)
        elif args.cmd == "ratio":
            out = fmt(ratio(args.a, args.b), spec)
        elif args.cmd == "cpu-per":
            out = fmt(cpu_per(args.ticks, args.count), spec)
        elif args.cmd == "cores":
            out = fmt(cores(args.ticks, args.seconds), spec)
        elif args.cmd == "rate":
            out = fmt(rate(args.count0, args.count1, args.t0, args.t1), spec)
        elif args.cmd == "elapsed":
            out = fmt(float(args.t1) - float(args.t0), spec)
        elif args.cmd == "json":
            v = json_field(args.file, args.key)
            out = fmt(v, spec) if isinstance(v, (int, float)) and spec != "g" else str(v)
        else:
            with open(args.file) as f:
                r, n, q = wrk(f.read())
            out = f"{fmt(r, spec)} {n} {q or '-'}"
    except ValueError as e:
        print(f"benchmath: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
