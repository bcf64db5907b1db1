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

-- BENCH_KEYS=N (scripts/bench-request-cost.sh's KEYS): each body carries "k", one of N
-- keys in turn (a request() callback: wrk then formats each request, on both sides alike).
local keys = tonumber(os.getenv("BENCH_KEYS") or "0") or 0
if keys > 0 then
  local head = wrk.body:sub(1, -2)
  local n = 0
  function request()
    n = n + 1
    return wrk.format(nil, nil, nil, head .. ',"k":"k' .. (n % keys) .. '"}')
  end
end

function init(args)
  local workflow = args[1] or "bench"
  wrk.path = "/serviceRequest/" .. workflow
end
