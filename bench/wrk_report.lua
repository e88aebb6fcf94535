-- Prints wrk's summary as one JSON line prefixed by "BENCH-JSON ", for the harness to parse.
-- Latencies are in microseconds, as wrk keeps them.

local percentiles = {1, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 98, 99, 99.5, 99.9, 99.99}

done = function(summary, latency, requests)
  local points = {}
  for _, p in ipairs(percentiles) do
    points[#points + 1] = string.format('"%g": %d', p, latency:percentile(p))
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH-JSON {"duration_us": %d, "requests": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"min": %d, "mean": %.1f, "max": %d, "percentiles": {%s}}}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, table.concat(points, ", ")))
end
