-- wrk script for the upload scenario: every request is a POST with a body of BODY_KIB kibibytes
-- (default 256) to the given path; the server drains the body and answers.
--   wrk ... -s upload.lua URL -- BODY_KIB
function init(args)
   local kib = tonumber(args[1]) or 256
   wrk.method = "POST"
   wrk.body = string.rep("x", kib * 1024)
   wrk.headers["Content-Type"] = "application/octet-stream"
end
