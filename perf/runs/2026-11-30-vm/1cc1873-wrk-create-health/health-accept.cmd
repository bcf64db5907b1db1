wrk -t2 -c128 -d15s --latency http://127.0.0.1:18090/health
