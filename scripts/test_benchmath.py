"""Tests of scripts/benchmath.py, the bench scripts' arithmetic.

    python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchmath  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmath.py")

WRK = """Running 10s test @ http://127.0.0.1:18090/health
  1 threads and 128 connections
  Latency Distribution
     50%    1.52ms
     75%    2.10ms
     90%    3.01ms
     99%   12.27ms
  211280 requests in 10.00s, 30.02MB read
  Non-2xx or 3xx responses: 17
Requests/sec:  21128.04
Transfer/sec:      3.00MB
"""


def run(*args, stdin=None):
    """The CLI's output (stripped) and exit status."""
    out = io.StringIO()
    old_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        with redirect_stdout(out):
            rc = benchmath.main(list(args))
    finally:
        sys.stdin = old_stdin
    return out.getvalue().strip(), rc


class Functions(unittest.TestCase):
    def test_median_odd_even_and_empty(self):
        self.assertEqual(benchmath.median(["3", "1", "2"]), 2)
        self.assertEqual(benchmath.median([0.34, 0.28, 0.35, 0.30]), 0.32)
        self.assertTrue(math.isnan(benchmath.median([])))

    def test_ratio(self):
        self.assertAlmostEqual(benchmath.ratio(21016, 74125), 0.28352, places=5)
        self.assertTrue(math.isnan(benchmath.ratio(1, 0)))

    def test_cpu_per_is_microseconds_per_item(self):
        # 150 ticks = 1.5 s of CPU over 60,000 requests: 25 µs each.
        self.assertAlmostEqual(benchmath.cpu_per(150, 60000), 25.0)
        # As bench-keys.sh had it inline: (s1 - s0) * 1e4 / secs / rate.
        ticks, secs, r = 97, 6, 20113
        self.assertAlmostEqual(benchmath.cpu_per(ticks, secs * r), ticks * 1e4 / secs / r)
        self.assertTrue(math.isnan(benchmath.cpu_per(5, 0)))

    def test_cores(self):
        self.assertAlmostEqual(benchmath.cores(150, 6), 0.25)
        self.assertTrue(math.isnan(benchmath.cores(150, 0)))

    def test_rate(self):
        self.assertEqual(benchmath.rate(100, 2100, 0.0, 4.0), 500)
        self.assertTrue(math.isnan(benchmath.rate(1, 2, 3.0, 3.0)))

    def test_p90_matches_the_scripts_index(self):
        xs = list(range(1, 11))  # 10 values: index int(9) - 1 = 8, the value 9
        self.assertEqual(benchmath.p90(reversed(xs)), 9)
        self.assertEqual(benchmath.p90([7]), 7)
        self.assertTrue(math.isnan(benchmath.p90([])))

    def test_wrk(self):
        self.assertEqual(benchmath.wrk(WRK), (21128.04, 17, "12.27ms"))
        r, n, q = benchmath.wrk("no output")
        self.assertTrue(math.isnan(r))
        self.assertEqual((n, q), (0, None))

    def test_json_field(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"achieved_rate": 12345.6, "e2e": {"completed_rate": 99.5}}, f)
        try:
            self.assertEqual(benchmath.json_field(f.name, "achieved_rate"), 12345.6)
            self.assertEqual(benchmath.json_field(f.name, "e2e.completed_rate"), 99.5)
        finally:
            os.unlink(f.name)


class Cli(unittest.TestCase):
    def test_median_from_arguments_and_stdin(self):
        self.assertEqual(run("median", "3", "1", "2"), ("2", 0))
        self.assertEqual(run("--fmt", ".2f", "median", stdin="0.35\n0.28\n0.34\n"), ("0.34", 0))

    def test_fmt_after_the_subcommand(self):
        self.assertEqual(run("ratio", "21016", "74125", "--fmt", ".2f"), ("0.28", 0))

    def test_nan_without_inputs(self):
        self.assertEqual(run("ratio", "1", "0"), ("nan", 0))
        self.assertEqual(run("median", stdin=""), ("nan", 0))

    def test_malformed_number_exits_2(self):
        self.assertEqual(run("ratio", "x", "1")[1], 2)

    def test_cpu_per_cores_rate_elapsed(self):
        self.assertEqual(run("cpu-per", "150", "60000", "--fmt", ".1f"), ("25.0", 0))
        self.assertEqual(run("cores", "150", "6", "--fmt", ".2f"), ("0.25", 0))
        self.assertEqual(run("rate", "100", "2100", "0", "4", "--fmt", ",.0f"), ("500", 0))
        self.assertEqual(run("elapsed", "1.25", "3.5", "--fmt", ".1f"), ("2.2", 0))

    def test_wrk_line(self):
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write(WRK)
        try:
            self.assertEqual(run("wrk", f.name, "--fmt", ".0f"), ("21128 17 12.27ms", 0))
        finally:
            os.unlink(f.name)

    def test_runs_as_a_program(self):
        out = subprocess.run([sys.executable, SCRIPT, "median", "5", "1", "4"],
                             capture_output=True, text=True, check=True).stdout
        self.assertEqual(out, "4\n")



class Soak(unittest.TestCase):
    """scripts/soak_report.py's arithmetic: windows between samples, and the summary."""

    def rows(self, completed, ticks, gb):
        return [
            {"minute": str(i), "t": str(60.0 * i), "completed": str(c), "created": "0",
             "dropped": "0", "failed": "0", "server_ticks": str(t), "pg_ticks": str(t),
             "bytes": str(int(g * 1e9)), "dead": "0", "vacuums": str(i), "live": "0",
             "partitions": "1", "wal": str(1000 * c)}
            for i, (c, t, g) in enumerate(zip(completed, ticks, gb))
        ]

    def test_windows_are_differences_per_second_and_per_request(self):
        import soak_report
        ws = soak_report.windows(self.rows([0, 6000, 12000], [0, 30, 90], [1, 2, 3]))
        self.assertEqual([w["minute"] for w in ws], [1, 2])
        self.assertEqual(ws[0]["rate"], 100.0)
        # 30 ticks each of server and Postgres over 6,000 requests: 50 µs apiece.
        self.assertAlmostEqual(ws[0]["server_us"], 50.0)
        self.assertAlmostEqual(ws[0]["cpu_us"], 100.0)
        self.assertAlmostEqual(ws[1]["cpu_us"], 200.0)
        self.assertEqual(ws[1]["gb"], 3.0)
        self.assertEqual(ws[1]["vacuums"], 1)
        self.assertEqual(ws[1]["wal_per"], 1000.0)

    def test_summary_compares_first_and_last_and_the_size_spread(self):
        import soak_report
        # The window ending at minute 10 is within the first ten minutes: its size (half
        # the rest) is not part of the spread.
        ws = [{"minute": m, "rate": 100.0 if m <= 5 else 90.0, "cpu_us": 10.0 if m <= 5 else 11.0,
               "gb": 0.5 if m == 10 else 1.0 + (m >= 12) * 0.1} for m in range(1, 21)]
        s = soak_report.summary(ws)
        self.assertAlmostEqual(s["rate_ratio"], 0.9)
        self.assertAlmostEqual(s["cpu_ratio"], 1.1)
        self.assertAlmostEqual(s["size_spread"], 1.1)

    def test_accounting_allows_only_the_answers_left_unread(self):
        import soak_report
        self.assertIn("every acknowledged", soak_report.accounting(100, 10, 80, 30, 64))
        self.assertIn("every acknowledged", soak_report.accounting(100, 0, 164, 0, 64))
        self.assertIn("missing", soak_report.accounting(100, 10, 80, 29, 64))
        self.assertIn("more rows", soak_report.accounting(100, 0, 165, 0, 64))

    def test_autovacuum_runs_are_read_from_the_log_and_put_in_their_window(self):
        import soak_report
        log = [
            '2026-12-06 00:00:30.500 UTC [7] LOG:  automatic vacuum of table '
            '"clamp_soak.public.service_requests_p20261206t000000": index scans: 1\n',
            "\tpages: 0 removed, 10 remain\n",
            "\tsystem usage: CPU: user: 0.20 s, system: 0.10 s, elapsed: 1.00 s\n",
            '2026-12-06 00:01:30 UTC [8] LOG:  automatic analyze of table '
            '"clamp_soak.public.steps_status_p20261206t000000"\n',
            "\tsystem usage: CPU: user: 0.05 s, system: 0.05 s, elapsed: 0.20 s\n",
            '2026-12-06 00:01:40 UTC [9] LOG:  automatic vacuum of table "clamp_soak.public.steps_status_p20261206t000100": index scans: 0\n',
            "2026-12-06 00:01:41 UTC [9] LOG:  something else\n",
            "\tsystem usage: CPU: user: 1.00 s, system: 0.00 s, elapsed: 1.00 s\n",
        ]
        runs = soak_report.autovacuum_runs(log)
        self.assertEqual(len(runs), 3)
        t0 = 1796515200.0  # 2026-12-06 00:00:00 UTC
        self.assertAlmostEqual(runs[0][0], t0 + 30.5)
        self.assertEqual(runs[0][1:3], ("vacuum", "service_requests_p20261206t000000"))
        self.assertAlmostEqual(runs[0][3], 0.3)
        rows = [{"t": str(t0 + 60 * i), "completed": str(30000 * i)} for i in range(3)]
        ws = [{}, {}]
        totals = soak_report.autovacuum_by_window(runs, ws, rows)
        self.assertAlmostEqual(ws[0]["vacuum_us"], 10.0)  # 0.3 s over 30,000 requests
        self.assertAlmostEqual(ws[1]["vacuum_us"], 1.1 * 1e6 / 30000)
        # The set begun at 00:00 was left once the one of 00:01 began.
        self.assertEqual(totals[("vacuum", "service_requests", "in use")][0], 1)
        self.assertEqual(totals[("analyze", "steps_status", "left")][0], 1)
        self.assertEqual(totals[("vacuum", "steps_status", "in use")][1], 1.0)
        self.assertEqual(soak_report.partition_role("workflows", 0.0, {}), "table")


if __name__ == "__main__":
    unittest.main()
