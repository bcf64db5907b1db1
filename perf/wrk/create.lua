-- POST /serviceRequest/<workflow> with a realistic claim payload (about 400 bytes).
-- Usage: wrk -s perf/wrk/create.lua http://127.0.0.1:8080 -- <workflow>
-- The request is static (no request/response callbacks), so wrk formats it once and
-- spends no Lua time per request: the load generator's cost matches the GET /health run.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Correlation-Id"] = "bench-run"
wrk.body = '{"claimDetails":{"claimType":"MOTOR","amount":1250.75,"currency":"EUR",' ..
  '"incidentDate":"2026-11-02","description":"rear bumper damaged in car park"},' ..
  '"customer":{"id":"C-1029384","name":"Jane Doe","email":"jane@example.com",' ..
  '"address":{"street":"1 Main St","city":"Springfield","zip":"12345"}},' ..
  '"policy":{"number":"P-55512","tier":"gold","active":true}}'

-- A server with tokens: BENCH_TOKEN (scripts/bench-request-cost.sh's TOKEN) is sent.
local token = os.getenv("BENCH_TOKEN")
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end

function init(args)
  local workflow = args[1] or "bench"
  wrk.path = "/serviceRequest/" .. workflow
end
