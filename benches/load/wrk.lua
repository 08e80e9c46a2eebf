-- wrk fallback of `cargo bench --bench load` (used only when oha cannot be installed).
-- Each request POSTs a random line of the file named after `--` (one JSON check body a line);
-- done() prints one JSON line: requests, duration, latency percentiles (us), errors.
local bodies = {}

function init(args)
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  math.randomseed(os.time())
end

function request()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"},
                    bodies[math.random(#bodies)])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d,"errors":%d,"non2xx":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9), e.connect + e.read + e.write + e.timeout, e.status))
end
