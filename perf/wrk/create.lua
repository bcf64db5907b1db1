-- POST /serviceRequest/<workflow> with a realistic claim payload.
-- Usage: wrk -s perf/wrk/create.lua http://127.0.0.1:8080 -- <workflow>
local workflow = "bench"
function init(args)
  if args[1] ~= nil then workflow = args[1] end
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Correlation-Id"] = "bench-run"
wrk.body = '{"claimDetails":{"claimType":"MOTOR","amount":1250.75,"currency":"EUR",' ..
  '"incidentDate":"2026-11-02","description":"rear bumper damaged in car park"},' ..
  '"customer":{"id":"C-1029384","name":"Jane Doe","email":"jane@example.com",' ..
  '"address":{"street":"1 Main St","city":"Springfield","zip":"12345"}},' ..
  '"policy":{"number":"P-55512","tier":"gold","active":true}}'
request = function()
  return wrk.format(nil, "/serviceRequest/" .. workflow)
end
local statuses = {}
response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
done = function(summary, latency, requests)
  io.write(string.format("errors: connect %d, read %d, write %d, status %d, timeout %d\n",
    summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout))
end
