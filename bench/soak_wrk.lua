-- bench/soak.py's wrk load: paced keep-alive GET /fast, every answer checked.
--
--   wrk -t N -c N -d SECONDS --timeout 30s -s soak_wrk.lua URL -- PREFIX PAUSE_MS FAILURES
--
-- One connection per thread (-t equal to -c), so that a thread's answer is always to the request
-- it made last: each request carries its own id (?id=PREFIX<thread>-<n>), each answer must be 200
-- with the body "fast ID\n", and each thread waits PAUSE_MS before its next request (paced, not
-- flat out). A thread appends "TIME ID STATUS" for a wrong answer, and "TIME ID lost" for a request whose
-- connection failed before its answer (wrk then reconnects and asks for the next request), to
-- FAILURES.<thread>, which the soak reads to tell the requests a killed worker held from the rest.
-- At the end one line "SOAK-WRK-JSON {...}" gives the counts.

local threads = {}

function setup(thread)
  threads[#threads + 1] = thread
  thread:set("number", #threads)
end

function init(args)
  prefix, pause, failures = args[1], tonumber(args[2]), args[3] .. "." .. number
  sent, good, bad, lost = 0, 0, 0, 0
  pending = nil
end

local function note(line)
  local file = io.open(failures, "a")
  file:write(line .. "\n")
  file:close()
end

function request()
  -- wrk calls request() once before the load to check the script, and that request is never
  -- sent: a request is taken as lost only once its thread has had an answer.
  if pending and good + bad > 0 then
    lost = lost + 1
    note(os.time() .. " " .. pending .. " lost")
  end
  sent = sent + 1
  pending = prefix .. number .. "-" .. sent
  return wrk.format("GET", "/fast?id=" .. pending)
end

function response(status, headers, body)
  if status == 200 and body == "fast " .. pending .. "\n" then
    good = good + 1
  else
    bad = bad + 1
    note(os.time() .. " " .. pending .. " " .. status)
  end
  pending = nil
end

function delay()
  return pause
end

function done(summary, latency, requests)
  local sent_total, good_total, bad_total, lost_total = 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    sent_total = sent_total + thread:get("sent")
    good_total = good_total + thread:get("good")
    bad_total = bad_total + thread:get("bad")
    lost_total = lost_total + thread:get("lost")
  end
  local e = summary.errors
  io.write(string.format(
    'SOAK-WRK-JSON {"sent": %d, "good": %d, "bad": %d, "lost": %d, "requests": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\n',
    sent_total, good_total, bad_total, lost_total, summary.requests,
    e.connect, e.read, e.write, e.status, e.timeout))
end
