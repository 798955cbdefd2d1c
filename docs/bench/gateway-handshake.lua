-- docs/bench/gateway.lua with a new connection (and so, over TLS, a full
-- handshake) for every request.
math.randomseed(42)
request = function()
  local id = math.random(1, 100000)
  return wrk.format("GET", "/stock/" .. id, {["x-seller-id"] = tostring(id), ["Connection"] = "close"})
end
