-- wrk script: a tiny non-streamed chat (one output token) on every request, as the earlier
-- Python load sent (contrib/bench/workers-2026-12-02). `wrk ... -s chat.lua -- close` adds
-- `Connection: close`: every request on a new connection (wrk reconnects when the server
-- closes). done() prints one line `WRKJSON {...}` for bench_workers_c.py.
wrk.method = "POST"
wrk.body = '{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"

function init(args)
  if args[1] == "close" then
    wrk.headers["Connection"] = "close"
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,"err_read":%d,' ..
    '"err_write":%d,"err_status":%d,"err_timeout":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
