-- One GCRA decision on a plain Redis, answered as redis-cell answers
-- CL.THROTTLE: the peer of weir's Redis protocol in bench/compare.sh
-- (`resp`), loaded with SCRIPT LOAD and run by redis-benchmark's EVALSHA.
-- KEYS[1]: the key; ARGV: max_burst, count, period (s), quantity.
local burst, count, period, q = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local emission = period * 1000000 / count
local tolerance = emission * (burst + 1)
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or 0), now)
local new_tat = tat + emission * q
local allow_at = new_tat - tolerance
if allow_at > now then
  return {1, burst + 1, 0, math.ceil((allow_at - now) / 1000000), math.ceil((tat - now) / 1000000)}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return {0, burst + 1, math.floor((now - allow_at) / emission), -1, math.ceil((new_tat - now) / 1000000)}
