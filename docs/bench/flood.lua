-- wrk: every request a new identity (thread number and counter), for floods.
local counter = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
request = function()
  counter = counter + 1
  return wrk.format("POST", "/v1/check", {["content-type"] = "application/json"},
    '{"policy":"tight","key":"flood-' .. id .. '-' .. counter .. '"}')
end
