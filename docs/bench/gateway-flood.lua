-- wrk: ten identities far over their limit, so nearly every request is
-- answered 429 (the gateway's refusal path).
math.randomseed(42)
request = function()
  local id = math.random(1, 10)
  return wrk.format("GET", "/stock/" .. id, {["x-seller-id"] = "flood-" .. id})
end
