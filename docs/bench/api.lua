math.randomseed(42)
request = function()
  local id = math.random(1, 100000)
  return wrk.format("POST", "/v1/check", {["content-type"] = "application/json"}, '{"policy":"api","key":"' .. id .. '"}')
end
