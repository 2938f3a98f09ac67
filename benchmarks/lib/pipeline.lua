-- wrk script used for every compare.sh measurement.
--   wrk ... -s pipeline.lua URL -- DEPTH
-- DEPTH > 1 sends DEPTH copies of the request in each write (HTTP/1.1 pipelining, as the
-- TechEmpower plaintext test does with 16); DEPTH 1 (the default) is wrk's ordinary
-- one-request-at-a-time loop. Headers given with -H are part of every request.
--   wrk ... -s pipeline.lua URL -- 1 BODY_KIB
-- BODY_KIB > 0 makes every request a POST with a body of that many KiB (the upload scenario).
-- done() prints one machine-readable line, "WRK_RESULT {json}", which compare.py parses; it runs
-- in wrk's main Lua state, where init() never ran, so it must not rely on init's locals.
-- wrk's own latency figures are closed-loop (see benchmarks/loadgen for open-loop latency).

function init(args)
   local depth = tonumber(args[1]) or 1
   local kib = tonumber(args[2]) or 0
   if kib > 0 then
      wrk.method = "POST"
      wrk.body = string.rep("x", kib * 1024)
      wrk.headers["Content-Type"] = "application/octet-stream"
   end
   if depth > 1 then
      local batch = {}
      for i = 1, depth do
         batch[i] = wrk.format()
      end
      local pipelined = table.concat(batch)
      request = function()
         return pipelined
      end
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'WRK_RESULT {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
      '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
      '"latency_us": {"mean": %.1f, "max": %d}}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.mean, latency.max))
end
