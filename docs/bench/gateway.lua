math.randomseed(42)
request = function()
  local id = math.random(1, 100000)
  return wrk.format("GET", "/stock/" .. id, {["x-seller-id"] = tostring(id)})
end
