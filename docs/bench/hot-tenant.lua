-- bench/compare.sh fleet: every request for the one hot key.
request = function()
  return wrk.format("GET", "/", {["x-tenant"] = "acme"})
end
