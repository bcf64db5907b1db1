wrk -t2 -c128 -d15s --latency -s perf/wrk/create.lua http://127.0.0.1:18090 -- bench
