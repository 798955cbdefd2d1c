-- weir: atomic decisions, docs/SPEC.md exactly. One call decides a batch of
-- requests in order, each over N keys (all-or-nothing), exactly as the same
-- requests made one call each, one after another, would be decided.
--
-- KEYS     the keys of every request's checks, request after request (a
--          request's keys share one hash slot on a cluster, and so do a
--          batch's), then optionally the generation marker
-- ARGV[1]  "m" when the last key is the generation marker, else "-"
-- then, for each request, a header and one argument per check:
--   "N MODE TIME"  N checks; MODE "peek" (decide, write nothing) or the
--          longest delay a shaper may impose (ns; a longer one refuses the
--          request, charging nothing); TIME "r" for Redis TIME, or "S NS"
--          (explicit seconds, nanoseconds)
--   per check: the policy, then " e" when a lost key counts as empty,
--          " c=K" for its cost (0: report the standing, charge nothing,
--          never refuse), " s" for a shadow check (decided and charged as if
--          enforced, but never refusing the request; when it would refuse it
--          charges nothing), and " r=R" for a report (usage after the fact:
--          always charged, possibly into debt, but never deeper than a report
--          of R, the largest, leaves a fresh key; allowed, with the wait of a
--          check of cost 1), and " n" when the key must not be created (a
--          client out of new keys: a missing key refuses the request,
--          storing nothing), " p" for a probe (answered as a check of its
--          cost, with no delay, charging nothing but the key's latest
--          time), " b=B,F,X,M" for a penalty (docs/SPEC.md's bans: ban B ns,
--          factor F, max X ns, memory M ns):
--          "tb C n p"  token bucket / GCRA: capacity C, rate reduced to n/p ns
--          "lb Q n p"  leaky bucket: queue Q, rate n/p
--          "fw L W"    fixed window      "sc L W" sliding counter
--                      (a calendar window: W is 0 and " z=NAME,S0,N0,..,S3,N3"
--                      gives the calendar's name and four boundaries, the
--                      windows before, holding and after the caller's now,
--                      as (seconds, nanoseconds); the window holding the
--                      check's time is the one decided in, or the one the
--                      key's state names, whose length it keeps)
--          "sl L W"    sliding log       (W in ns)
--          "cc L D"    concurrency limit: at most L in flight, leases of D ns;
--                      " i=ID" the lease a check takes, " x=ID" a release and
--                      " w=ID" a renewal of lease ID (cost ignored)
-- Returns, request after request, {all_allowed, state_lost, then per check:
-- allowed, remaining, retry_after, reset, delay, late, created, wait1, banned,
-- new_ban}
-- (`wait1`: for a check of cost above 1 that was refused, the wait until
-- one of cost 1 fits, else 0; `banned`: the wait until the key's ban ends (`new_ban`: 1 when this call began it),
-- else 0; durations
-- in ns; `late`: how far the key's latest time moved the check's time
-- forward, the origin of its durations being the given time plus `late`;
-- `created`: 1 when this call stored a key that did not exist, 2 when a
-- " n" check found its key missing and refused the request, else 0). A check that
-- would allow but was charged nothing (another refused) reports its
-- standing as it is.
--
-- State loss: the marker holds the time the store was last found without it
-- (a restart without data, a flush, an eviction). Keys missing since then
-- count, for policies marked " e", as used up at that time; others start
-- full.
--
-- Exactness: a check whose quantities all stay below 2^51 is decided in
-- doubles (exact integers below 2^53); any other (long windows and periods,
-- large limits, deep debt) in wide integers (`w*` below), with the same
-- formulas. Times are (seconds, nanoseconds) pairs, so absolute nanoseconds
-- (~1.8e18) never appear in a double. A wait of 2^53 ns or more is replied
-- as a decimal string, at most i64::MAX (weir-core's MAX_WAIT).
--
-- State per key (a string): a tag naming the algorithm and the parameters
-- its numbers are in ("tC,p:" a token bucket of capacity C and period p,
-- "ln:" a leaky bucket of rate numerator n, "fW:"/"sW:" windows of W ns,
-- "g:" a log, "c:" leases; a state read under another tag is converted or
-- forgotten: `untag`), then "seen_s seen_ns ..." and
--   tb/lb: level (1/p token units at seen, decimal)
--   fw: start_s start_ns count (a calendar's: then its window's length, s)
--   sc: start_s start_ns cur prev
--   sl: first_s first_ns total last_s last_ns (the entries' cost, the
--       last one's time), then "|" and entries (varint gap in ns from the
--       previous, varint cost), or "#" and entries (the gap as varint
--       seconds and varint nanoseconds, varint cost) for windows of 2^51 ns
--       or more
--   cc: then the cost held, and per lease, in order of expiry,
--       "|id cost expires_s expires_ns" (ids are decimal text: 64-bit, never
--       arithmetic)
-- A key under a penalty that was banned within its memory starts with
-- "!until_s until_ns level at_s at_ns;" (its ban: when it ends, how many
-- in a row, when the last began) before the tag.
-- (A log or lease list written before its header held the totals, without
-- them, is read whole once and written back with them; a state written
-- before tags, digits first, is read as it is.)

local E9 = 1000000000
local LOG_TAG, LEASE_TAG = 'g:', 'c:' -- their parameters never change what the state means
local BIG = 9007199254740992 -- 2^53
local LIM = 2251799813685248 -- 2^51: below it, a check is decided in doubles

local function idiv(a, b) -- exact floor(a / b) for 0 <= a, b < 2^53
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end
local function cdiv(a, b) local q = idiv(a, b); if q * b < a then q = q + 1 end; return q end
local function mulmod(a, b, m) -- a * b mod m, all below 2^53
  local r = 0
  a = a % m
  while b > 0 do
    if b % 2 == 1 then r = (r + a) % m end
    a = (a * 2) % m
    b = math.floor(b / 2)
  end
  return r
end
local function later(as, an, bs, bn)
  if as > bs or (as == bs and an >= bn) then return as, an end
  return bs, bn
end
local function diff(as, an, bs, bn) -- (a - b) in ns, a >= b, saturating at 2^53
  if as - bs > 9000000 then return BIG end
  return (as - bs) * E9 + (an - bn)
end
local function add(s, n, d) -- pair + d ns (d < 2^53)
  if n + d < E9 then return s, n + d end
  local extra = idiv(n + d, E9)
  return s + extra, n + d - extra * E9
end
local function sub(s, n, d) -- pair - d ns (d < 2^53, result >= 0)
  if d <= n then return s, n - d end
  local back = cdiv(math.max(d - n, 0), E9)
  return s - back, n + back * E9 - d
end
-- '%d' goes through a C long (64 bits): exact for every integer below 2^53,
-- and several times cheaper than '%.0f'.
local function fmt(x) return string.format('%d', x) end
local function fmt3(x, y, z) return string.format('%d %d %d', x, y, z) end


local function varint(x)
  local out = {}
  repeat
    local b = x % 128
    x = (x - b) / 128
    if x > 0 then b = b + 128 end
    out[#out + 1] = string.char(b)
  until x == 0
  return table.concat(out)
end
local function read_varint(s, pos)
  local x, mul = 0, 1
  while true do
    local b = string.byte(s, pos)
    pos = pos + 1
    if b < 128 then return x + b * mul, pos end
    x = x + (b - 128) * mul
    mul = mul * 128
  end
end

-- Wide integers, and the algorithms in them, for the checks whose
-- quantities outgrow doubles: built on a call's first such check (each
-- function is a closure made when the script runs, and most calls need none).
local wide_lib
local function wide()
  if wide_lib then return wide_lib end
  -- Wide integers: non-negative integers of any size as little-endian arrays
  -- of base-2^24 limbs (a limb product stays below 2^48), for the checks whose
  -- quantities outgrow doubles. Zero is {}.
  local LB = 16777216 -- 2^24
  local function trim(a) while #a > 0 and a[#a] == 0 do a[#a] = nil end; return a end
  local function wsmall(a, m, c) -- a * m + c, for m, c < 2^24
    local r = {}
    for i = 1, #a do
      local v = a[i] * m + c
      c = math.floor(v / LB)
      r[i] = v - c * LB
    end
    while c > 0 do local l = c % LB; r[#r + 1] = l; c = (c - l) / LB end
    return trim(r)
  end
  local function W(x) -- from a non-negative integer number or decimal text
    if type(x) == 'table' then return x end
    local r = {}
    if type(x) == 'string' then
      for k = 1, #x, 6 do
        local part = string.sub(x, k, k + 5)
        r = wsmall(r, 10 ^ #part, tonumber(part))
      end
      return r
    end
    while x > 0 do local l = x % LB; r[#r + 1] = l; x = (x - l) / LB end
    return r
  end
  local function wnum(a) -- as a double (exact below 2^53)
    local v = 0
    for i = #a, 1, -1 do v = v * LB + a[i] end
    return v
  end
  local function wcmp(a, b)
    if #a ~= #b then return #a < #b and -1 or 1 end
    for i = #a, 1, -1 do
      if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
    end
    return 0
  end
  local function wadd(a, b)
    local r, c = {}, 0
    for i = 1, math.max(#a, #b) do
      local v = (a[i] or 0) + (b[i] or 0) + c
      if v >= LB then r[i], c = v - LB, 1 else r[i], c = v, 0 end
    end
    if c > 0 then r[#r + 1] = c end
    return r
  end
  local function wsub(a, b) -- a - b, for a >= b
    local r, c = {}, 0
    for i = 1, #a do
      local v = a[i] - (b[i] or 0) - c
      if v < 0 then r[i], c = v + LB, 1 else r[i], c = v, 0 end
    end
    return trim(r)
  end
  local function wsat(a, b) if wcmp(a, b) > 0 then return wsub(a, b) end; return {} end
  local function wmul(a, b)
    if #a == 0 or #b == 0 then return {} end
    local r = {}
    for i = 1, #a + #b do r[i] = 0 end
    for i = 1, #a do
      local c = 0
      for j = 1, #b do
        local v = r[i + j - 1] + a[i] * b[j] + c
        c = math.floor(v / LB)
        r[i + j - 1] = v - c * LB
      end
      r[i + #b] = r[i + #b] + c
    end
    return trim(r)
  end
  local function wshort(a, d) -- floor(a / d) and the remainder, for 0 < d < 2^24
    local q, r = {}, 0
    for i = #a, 1, -1 do
      -- v < d·2^24: the quotient is below 2^24, and at least 1/d from the
      -- next integer, far more than a double's rounding there.
      local v = r * LB + a[i]
      local k = math.floor(v / d)
      r = v - k * d
      q[i] = k
    end
    return trim(q), r
  end
  local function wdiv(a, b) -- floor(a / b) and the remainder, for b > 0
    if #b == 1 then local q, r = wshort(a, b[1]); return q, W(r) end
    -- Subtract under-estimates of the quotient (doubles are within 2^-50 of
    -- the operands; 1e-10 less is always short) until less than b is left.
    local q, r = {}, a
    while wcmp(r, b) >= 0 do
      local e = W(math.max(math.floor(wnum(r) / wnum(b) * (1 - 1e-10)), 1))
      r, q = wsub(r, wmul(e, b)), wadd(q, e)
    end
    return q, r
  end
  local function wfloor(a, b) local q = wdiv(a, b); return q end
  local function wceil(a, b)
    local q, r = wdiv(a, b)
    if #r > 0 then q = wadd(q, { 1 }) end
    return q
  end
  local function wtext(a) -- decimal
    if #a <= 2 then return fmt(wnum(a)) end
    local parts, r = {}, nil
    while #a > 2 do
      a, r = wshort(a, 1000000)
      table.insert(parts, 1, string.format('%06d', r))
    end
    return fmt(wnum(a)) .. table.concat(parts)
  end
  -- As limbs: building them with `W` would cost every call.
  local E9W = { 10144256, 59 } -- 10^9
  local BIGW = { 0, 0, 32 } -- 2^53
  local MAX_WAIT = { 16777215, 16777215, 32767 } -- i64::MAX ns, as weir-core saturates
  -- A wait: a number below 2^53, else a wide integer (at most MAX_WAIT).
  local function dur(a)
    if wcmp(a, BIGW) < 0 then return wnum(a) end
    if wcmp(a, MAX_WAIT) > 0 then return MAX_WAIT end
    return a
  end
  -- (s, ns) - (bs, bn) as a wide integer of ns, for (s, ns) >= (bs, bn).
  local function welapsed(s, ns, bs, bn)
    if ns >= bn then return wadd(wmul(W(s - bs), E9W), W(ns - bn)) end
    return wadd(wmul(W(s - bs - 1), E9W), W(ns + E9 - bn))
  end
  local function wpair(a) -- a wide count of ns as (s, ns)
    local s, n = wdiv(a, E9W)
    return wnum(s), wnum(n)
  end

  -- The same algorithms in wide integers, for checks whose quantities reach
  -- 2^51 (`n`, `p`, `W` and the level wide; counts, costs and the ceiling are
  -- at most 2^50 and stay numbers).

  local function wdrained(raw, s1, s2, level, n, ts, tn)
    if not raw then return {} end
    return wsat(level, wmul(welapsed(ts, tn, s1, s2), n))
  end

  local function wlevel_text(ts, tn, level) return string.format('%d %d %s', ts, tn, wtext(level)) end

  local function wtoken_bucket(size, n, p, cost, report, standing, level, ts, tn)
    local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
    local full, need = wmul(W(size), p), wadd(level, wmul(W(cost), p))
    if report then
      local ceiling = wmul(W(report), p)
      if wcmp(need, ceiling) > 0 then need = ceiling end
    end
    if standing then left0, idle0 = wnum(wfloor(wsat(full, level), p)), dur(wceil(level, n)) end
    if report then
      allowed, remaining, reset = 1, wnum(wfloor(wsat(full, need), p)), dur(wceil(need, n))
      local next = wadd(need, p)
      if wcmp(next, full) > 0 then retry = dur(wceil(wsub(next, full), n)) end
      new = wlevel_text(ts, tn, need)
    elseif wcmp(need, full) <= 0 then
      allowed, remaining, reset = 1, wnum(wfloor(wsub(full, need), p)), dur(wceil(need, n))
      new = wlevel_text(ts, tn, need)
    else
      remaining = wnum(wfloor(wsat(full, level), p))
      retry, reset = dur(wceil(wsub(need, full), n)), dur(wceil(level, n))
    end
    if allowed == 0 or cost == 0 then fresh = wlevel_text(ts, tn, level) end
    return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
  end

  local function wleaky_bucket(size, n, p, cost, report, level, ts, tn)
    local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
    local bound, slots = wmul(W(size), p), wmul(W(size + 1), p)
    left0, idle0 = wnum(wfloor(wsat(slots, level), p)), dur(wceil(level, n))
    if report then
      local after, ceiling = wadd(level, wmul(W(cost), p)), wmul(W(report), p)
      if wcmp(after, ceiling) > 0 then after = ceiling end
      allowed, reset = 1, dur(wceil(after, n))
      remaining = wnum(wfloor(wsat(slots, after), p))
      if wcmp(after, bound) > 0 then retry = dur(wceil(wsub(after, bound), n)) end
      new = wlevel_text(ts, tn, after)
    elseif wcmp(level, bound) <= 0 then
      local after = wadd(level, wmul(W(cost), p))
      allowed, delay, reset = 1, dur(wceil(level, n)), dur(wceil(after, n))
      remaining = wnum(wfloor(wsat(slots, after), p))
      new = wlevel_text(ts, tn, after)
    else
      remaining, retry, reset = left0, dur(wceil(wsub(level, bound), n)), idle0
    end
    if allowed == 0 or cost == 0 then fresh = wlevel_text(ts, tn, level) end
    return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
  end

  -- A sliding counter's standing with `c` in the current window, wide.
  local function wsc_standing(L, W_, prev, left, c)
    local r = 0
    if L >= c then
      local room, used = wmul(W(L - c), W_), wmul(W(prev), left)
      if wcmp(room, used) >= 0 then r = wnum(wfloor(wsub(room, used), W_)) end
    end
    local reset = 0
    if c > 0 then reset = dur(wadd(left, W_)) elseif prev > 0 then reset = dur(left) end
    return r, reset
  end

  -- Whether `c` more fit with `prev` weighted by `left`: L - c >= 0 and
  -- prev·left <= (L - c)·W; and if not, the wait until they would.
  local function wsc_fits(L, W_, prev, left, cur, c)
    if L - cur - c >= 0 and wcmp(wmul(W(prev), left), wmul(W(L - cur - c), W_)) <= 0 then return true, 0 end
    if cur + c <= L then return false, dur(wsub(left, wfloor(wmul(W(L - cur - c), W_), W(prev)))) end
    return false, dur(wadd(left, wsub(W_, wfloor(wmul(W(L - c), W_), W(cur)))))
  end

  local function wsliding_counter(L, W_, cost, report, ss, sn, left, cur, prev, ts, tn)
    local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
    left0, idle0 = wsc_standing(L, W_, prev, left, cur)
    if report then
      local after = math.min(cur + cost, report)
      allowed = 1
      remaining, reset = wsc_standing(L, W_, prev, left, after)
      -- The wait of a check of cost 1 on the new counts.
      local _
      _, retry = wsc_fits(L, W_, prev, left, after, 1)
      new = string.format('%d %d %d %d %d %d', ts, tn, ss, sn, after, prev)
    else
      local fits, wait = wsc_fits(L, W_, prev, left, cur, cost)
      if fits then
        allowed = 1
        remaining, reset = wsc_standing(L, W_, prev, left, cur + cost)
        new = string.format('%d %d %d %d %d %d', ts, tn, ss, sn, cur + cost, prev)
      else
        remaining, retry, reset = left0, wait, idle0
      end
    end
    if allowed == 0 or cost == 0 then fresh = string.format('%d %d %d %d %d %d', ts, tn, ss, sn, cur, prev) end
    return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
  end

  wide_lib = {
    W = W, num = wnum, cmp = wcmp, add = wadd, sub = wsub, sat = wsat, mul = wmul, div = wdiv, ceil = wceil, text = wtext,
    dur = dur, elapsed = welapsed, pair = wpair, drained = wdrained,
    token_bucket = wtoken_bucket, leaky_bucket = wleaky_bucket, sliding_counter = wsliding_counter,
  }
  return wide_lib
end

-- A wait as replied: a wide one as decimal text.
local function reply(d) if type(d) == 'table' then return wide().text(d) end; return d end
local function positive(d) return type(d) == 'table' or d > 0 end
-- The larger of a wait below 2^53 and a duration (a wide one is larger).
local function at_least(w, d) if type(d) == 'table' then return d end; return math.max(w, d) end

-- Whether a wait is longer than the longest delay allowed (`max_delay`, and
-- as text, `mode`).
local function over(delay, max_delay, mode)
  if type(delay) ~= 'table' then return delay > max_delay end
  return max_delay < BIG or wide().cmp(delay, wide().W(mode)) > 0
end

local marker = ARGV[1] == 'm' and KEYS[#KEYS] or nil
local marker_value -- read once per call: nil before, false when missing
local redis_s, redis_ns -- Redis TIME, read once per call

local function window_start(s, n, W) -- the start of the window holding (s, n)
  return sub(s, n, (mulmod(s, E9 % W, W) + n % W) % W)
end

-- A check's argument: kind, its three numbers, cost and flags; parsed once
-- per call (a batch repeats a few policies many times).
local parsed = {}
local function parse(arg)
  local p = parsed[arg]
  if not p then
    -- A lease flag comes last and differs per check: split off, so that
    -- the policy is parsed once per call.
    local base, lease = string.match(arg, '^(.*) ([ixw]=%d+)$')
    if base then
      local k, a, b, c, cost, empty, shadow, report, no_new, _, tag, probe, penalty = parse(base)
      return k, a, b, c, cost, empty, shadow, report, no_new, lease, tag, probe, penalty
    end
    local spec = {}
    for w in string.gmatch(arg, '%S+') do spec[#spec + 1] = w end
    p = { spec[1], tonumber(spec[2]), tonumber(spec[3]), tonumber(spec[4]), 1, false, false, false, false }
    local k = spec[1]
    if k == 'tb' then p[10] = 't' .. spec[2] .. ',' .. spec[4] .. ':'
    elseif k == 'lb' then p[10] = 'l' .. spec[3] .. ':'
    elseif k == 'fw' or k == 'sc' then p[10] = string.sub(k, 1, 1) .. spec[3] .. ':'
    elseif k == 'sl' then p[10] = LOG_TAG
    else p[10] = LEASE_TAG end
    local flags = (spec[1] == 'tb' or spec[1] == 'lb') and 5 or 4
    for k = flags, #spec do
      if spec[k] == 'e' then p[6] = true
      elseif spec[k] == 's' then p[7] = true
      elseif spec[k] == 'n' then p[9] = true
      elseif spec[k] == 'p' then p[11] = true
      elseif string.sub(spec[k], 1, 2) == 'b=' then
        local B, F, X, M = string.match(spec[k], '^b=(%d+),(%d+),(%d+),(%d+)$')
        p[12] = { tonumber(B), tonumber(F), tonumber(X), tonumber(M) }
      elseif string.sub(spec[k], 1, 2) == 'z=' then
        local name, bounds = string.match(spec[k], '^z=([^,]+),(.*)$')
        local cal = {}
        for n in string.gmatch(bounds, '%d+') do cal[#cal + 1] = tonumber(n) end
        p[13], p[10] = cal, 'k' .. name .. ':'
      elseif string.sub(spec[k], 1, 2) == 'r=' then p[8] = tonumber(string.sub(spec[k], 3))
      elseif string.sub(spec[k], 1, 2) == 'c=' then p[5] = tonumber(string.sub(spec[k], 3)) end
    end
    parsed[arg] = p
  end
  return p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], nil, p[10], p[11], p[12]
end

-- A calendar window's boundaries, as its check's argument gives them (nil:
-- not a calendar).
local function calendar(arg)
  local p = parsed[arg]
  return p and p[13]
end

-- The calendar window holding (ts, tn): among the three the caller gave, or
-- the one the key's state names (its start s3, s4 and its length s6 in
-- seconds: a check clamped to the key's latest time, later than the
-- caller's). Its start, the time left in it (wide past 2^51 ns: a year), and
-- its length in seconds. Boundaries are local midnights: whole seconds.
local function calendar_window(cal, ts, tn, s3, s4, s6)
  local function within(ss, sn, es, en)
    if (ts < ss or (ts == ss and tn < sn)) or not (ts < es or (ts == es and tn < en)) then return nil end
    local left = diff(es, en, ts, tn)
    if left >= LIM then left = wide().dur(wide().elapsed(es, en, ts, tn)) end
    return ss, sn, left, es - ss
  end
  for i = 0, 2 do
    local ss, sn, left, len = within(cal[2 * i + 1], cal[2 * i + 2], cal[2 * i + 3], cal[2 * i + 4])
    if ss then return ss, sn, left, len end
  end
  if s3 and s6 and s6 > 0 then
    local ss, sn, left, len = within(s3, s4, s3 + s6, s4)
    if ss then return ss, sn, left, len end
  end
  error('weir: no calendar window was given for this time (the clocks disagree by more than a window)')
end

-- A check's three numbers as wide integers, for the checks decided wide.
local wide_parsed = {}
local function wide_params(arg)
  local p = wide_parsed[arg]
  if not p then
    local x, y, z = string.match(arg, '^%S+ (%d+) (%d+) ?(%d*)')
    local X = wide()
    p = { X.W(x), X.W(y), X.W(z) }
    wide_parsed[arg] = p
  end
  return p[1], p[2], p[3]
end

-- Whether a check's quantities may outgrow doubles: its parameters (size
-- `a`, then `b` and `c`: n and p, or the window), the stored counts or
-- level, and its cost and report ceiling. Doubles round monotonically, so
-- a product of 2^51 or more is never taken for less.
local function is_wide(kind, a, b, c, s3, s5, s6, cost, report)
  if kind == 'tb' or kind == 'lb' then
    return not ((a + 1) * c < LIM and b < LIM and (s3 or 0) < LIM and (not report or report * c < LIM))
  elseif kind == 'sc' then
    return not (b < LIM and math.max(a, (s5 or 0) + cost, s6 or 0, report or 0) * b < LIM)
  elseif kind == 'cc' then
    return false -- a limit and a lease below 2^51
  end
  return not (b < LIM)
end

local function store(key, tag, text, reset, redis_time, ban)
  -- A log's or a lease list's text comes with its tag (long: not copied
  -- again to add it).
  if string.byte(text, 1) ~= string.byte(tag, 1) then text = tag .. text end
  if ban then
    -- Kept while the ban or its memory lasts, whatever the state's reset.
    text = ban[1] .. text
    if type(reset) ~= 'table' and ban[2] > reset then reset = ban[2] end
  end
  if redis_time and reset == 0 then
    redis.call('DEL', key)
  elseif redis_time then
    local ms
    if type(reset) == 'table' then
      local X = wide()
      ms = X.num(X.ceil(reset, X.W(1000000)))
    else ms = cdiv(reset, 1000000) end
    redis.call('SET', key, text, 'PX', math.max(ms, 1))
  else
    -- Explicit times (replay, tests) say nothing of the Redis clock: keep
    -- the state an hour, so runs do not litter the server.
    redis.call('SET', key, text, 'PX', 3600000)
  end
end

-- Up to six numbers of a state's text ("a b [c [d [e [f]]]]"), without a
-- table: a call decides many checks, and tables are most of a check's cost.
local function nums(text)
  local a, b, c, d, e, f = string.match(text, '^(%d+) (%d+) ?(%d*) ?(%d*) ?(%d*) ?(%d*)$')
  return tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e), tonumber(f)
end

-- A sliding counter's standing with `c` in the current window: remaining and
-- reset.
local function sc_standing(L, W, prev, left, c)
  local room, used = (L - c) * W, prev * left
  local r = 0
  if room >= used then r = idiv(room - used, W) end
  local reset = 0
  if c > 0 then reset = left + W elseif prev > 0 then reset = left end
  return r, reset
end

-- The algorithms, each as weir-core has it (`algo/level.rs`,
-- `algo/window.rs`, `algo/log.rs`): from a key's state at time (ts, tn) and
-- a request's cost to allowed, remaining, retry, reset, delay, the state
-- text if charged (`new`) and the refreshed one if not (`fresh`), and the
-- standing with no request (remaining, reset). `report`: the ceiling on
-- debt (a report is always charged, up to it), or false for a check;
-- `standing`: the standing is wanted (a cost of 0, or several checks).

-- A level (token bucket, GCRA, leaky bucket) at (ts, tn), drained at n per
-- ns since the state's time (s1, s2) from its level s3.
local function drained(raw, s1, s2, s3, n, ts, tn)
  if not raw then return 0 end
  local el = diff(ts, tn, s1, s2)
  if el > idiv(s3, n) + 1 then return 0 end
  return math.max(s3 - el * n, 0)
end

-- Token bucket and GCRA (`tb`): capacity `size`, rate n per p ns.
local function token_bucket(size, n, p, cost, report, standing, level, ts, tn)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  local full, need = size * p, level + cost * p
  if report then need = math.min(need, report * p) end
  -- The standing: for a cost of 0, or a request others may refuse.
  if standing then left0, idle0 = idiv(math.max(full - level, 0), p), cdiv(level, n) end
  if report then
    -- Always charged, possibly into debt; retry: to a check of cost 1.
    allowed, remaining, reset = 1, idiv(math.max(full - need, 0), p), cdiv(need, n)
    if need + p > full then retry = cdiv(need + p - full, n) end
    new = fmt3(ts, tn, need)
  elseif need <= full then
    allowed, remaining, reset = 1, idiv(full - need, p), cdiv(need, n)
    new = fmt3(ts, tn, need)
  else
    remaining, retry, reset = idiv(math.max(full - level, 0), p), cdiv(need - full, n), cdiv(level, n)
  end
  -- The refreshed state, written only by a rejection or a standing.
  if allowed == 0 or cost == 0 then fresh = fmt3(ts, tn, level) end
  return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
end

-- Leaky bucket (`lb`): a queue of `size`, one slot each p/n ns.
local function leaky_bucket(size, n, p, cost, report, level, ts, tn)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  local bound, slots = size * p, (size + 1) * p
  -- Always: a wait over max_delay refuses an allowed check too.
  left0, idle0 = idiv(math.max(slots - level, 0), p), cdiv(level, n)
  if report then
    local after = math.min(level + cost * p, report * p)
    allowed, reset = 1, cdiv(after, n)
    remaining = idiv(math.max(slots - after, 0), p)
    if after > bound then retry = cdiv(after - bound, n) end
    new = fmt3(ts, tn, after)
  elseif level <= bound then
    local after = level + cost * p
    allowed, delay, reset = 1, cdiv(level, n), cdiv(after, n)
    remaining = idiv(math.max(slots - after, 0), p)
    new = fmt3(ts, tn, after)
  else
    remaining, retry, reset = idiv(math.max(slots - level, 0), p), cdiv(level - bound, n), cdiv(level, n)
  end
  -- The refreshed state, written only by a rejection or a standing.
  if allowed == 0 or cost == 0 then fresh = fmt3(ts, tn, level) end
  return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
end

-- A window policy's counts at (ts, tn): the window's start, the time left
-- in it (wide when `wide`, the window as a wide integer, is given), the
-- current count and (a sliding counter's) the previous one.
local function window_counts(sliding, W_, wide, raw, s3, s4, s5, s6, ts, tn)
  local ss, sn, left
  local X = wide and wide_lib
  if wide then
    local t = X.elapsed(ts, tn, 0, 0)
    local _, offset = X.div(t, wide)
    ss, sn = X.pair(X.sub(t, offset))
    left = X.sub(wide, offset)
  else
    ss, sn = window_start(ts, tn, W_)
    left = W_ - diff(ts, tn, ss, sn)
  end
  local cur, prev = 0, 0
  if raw then
    if s3 == ss and s4 == sn then cur, prev = s5, s6 or 0
    elseif sliding then
      -- The previous window's count, if the stored window is the one before.
      local before
      if wide then before = X.cmp(X.elapsed(ss, sn, s3, s4), wide) == 0
      else local ps, pn = add(s3, s4, W_); before = ps == ss and pn == sn end
      if before then cur, prev = 0, s5 end
    end
  end
  return ss, sn, left, cur, prev
end

-- Fixed window (`fw`): at most L per aligned window.
local function fixed_window(L, cost, report, ss, sn, left, cur, ts, tn, tail)
  tail = tail or ''
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  left0, idle0 = math.max(L - cur, 0), (cur > 0) and left or 0
  if report then
    local after = math.min(cur + cost, report)
    allowed, remaining, reset = 1, math.max(L - after, 0), (after > 0) and left or 0
    if after + 1 > L then retry = left end
    new = string.format('%d %d %d %d %d', ts, tn, ss, sn, after) .. tail
  elseif cur + cost <= L then
    allowed, remaining, reset = 1, L - cur - cost, left
    new = string.format('%d %d %d %d %d', ts, tn, ss, sn, cur + cost) .. tail
  else
    remaining, retry, reset = math.max(L - cur, 0), left, (cur > 0) and left or 0
  end
  -- The refreshed state, written only by a rejection or a standing.
  if allowed == 0 or cost == 0 then fresh = string.format('%d %d %d %d %d', ts, tn, ss, sn, cur) .. tail end
  return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
end

-- Sliding counter (`sc`): the current window's count plus the previous
-- one's, weighted by the part of it still in the sliding window.
local function sliding_counter(L, W, cost, report, ss, sn, left, cur, prev, ts, tn)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  left0, idle0 = sc_standing(L, W, prev, left, cur)
  if report then
    local after = math.min(cur + cost, report)
    allowed = 1
    remaining, reset = sc_standing(L, W, prev, left, after)
    -- The wait of a check of cost 1 on the new counts.
    if not (L - after - 1 >= 0 and prev * left <= (L - after - 1) * W) then
      if after + 1 <= L then retry = left - idiv((L - after - 1) * W, prev)
      else retry = left + (W - idiv((L - 1) * W, after)) end
    end
    new = string.format('%d %d %d %d %d %d', ts, tn, ss, sn, after, prev)
  elseif L - cur - cost >= 0 and prev * left <= (L - cur - cost) * W then
    allowed = 1
    remaining, reset = sc_standing(L, W, prev, left, cur + cost)
    new = string.format('%d %d %d %d %d %d', ts, tn, ss, sn, cur + cost, prev)
  else
    remaining, reset = left0, idle0
    if cur + cost <= L then retry = left - idiv((L - cur - cost) * W, prev)
    else retry = left + (W - idiv((L - cost) * W, cur)) end
  end
  if allowed == 0 or cost == 0 then fresh = string.format('%d %d %d %d %d %d', ts, tn, ss, sn, cur, prev) end
  return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
end

-- Sliding log (`sl`): every admission's time and cost, at most L in any
-- window of W ns (`wide`: the window as a wide integer, for windows of 2^51
-- ns or more; entries then store their gaps as seconds and nanoseconds).
-- The state's header holds the entries' total cost and the last one's time,
-- so a call reads only the entries that expired since the key was last
-- written and, refused, the few whose expiry makes room: never the whole
-- log (a key of 1,000 entries costs a refusal what a key of 10 does).
-- `total`, (ls, ln): from the header; nil for a state written before it had
-- them, which is read whole once.
local function sliding_log(L, W_, wide, cost, report, raw, s3, s4, blob, ts, tn, total, ls, ln)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  local X = wide and wide_lib
  local ws, wn
  if wide then ws, wn = X.pair(wide) end
  local bar = wide and '#' or '|'
  -- The time an entry at (es, en) has left in the window at (ts, tn); 0
  -- when it has expired.
  local function left_of(es, en)
    if not wide then return math.max(W_ - diff(ts, tn, es, en), 0) end
    local rs, rn = es + ws, en + wn
    if rn >= E9 then rs, rn = rs + 1, rn - E9 end
    if rs < ts or (rs == ts and rn <= tn) then return 0 end
    return X.dur(X.elapsed(rs, rn, ts, tn))
  end
  if not (raw and #blob > 1) then blob = '' end
  local paired = string.sub(blob, 1, 1) == '#'
  -- The entry at byte `pos` after the one at (es, en): its time, cost and
  -- the position after it.
  local function entry(pos, es, en)
    local c2
    if paired then
      local gs, gn
      gs, pos = read_varint(blob, pos)
      gn, pos = read_varint(blob, pos)
      es, en = es + gs, en + gn
      if en >= E9 then es, en = es + 1, en - E9 end
    else
      local gap
      gap, pos = read_varint(blob, pos)
      es, en = add(es, en, gap)
    end
    c2, pos = read_varint(blob, pos)
    return es, en, c2, pos
  end
  if not total then -- an older state: totalled once
    total, ls, ln = 0, s3, s4
    local pos, es, en = 2, s3, s4
    while pos <= #blob do
      local c2
      es, en, c2, pos = entry(pos, es, en)
      total, ls, ln = total + c2, es, en
    end
  end
  -- The first live entry (a > t - W): its time, cost and position, and
  -- the position after it; what expired before it leaves the total.
  local count, fs, fn, fc, at, after_first = total, nil, nil, 0, 2, 2
  do
    local es, en = s3, s4
    while at <= #blob do
      local c2, next
      es, en, c2, next = entry(at, es, en)
      if left_of(es, en) ~= 0 then fs, fn, fc, after_first = es, en, c2, next; break end
      count, at = count - c2, next
    end
  end
  -- The log without its expired entries (the first live one's gap now 0),
  -- and `extra` = {cost} appended at (ts, tn).
  local zero = wide and varint(0) .. varint(0) or varint(0)
  -- A gap of (gs, gn) - (ps, pn) as this window's entries store it.
  local function gap(gs, gn, ps, pn)
    if not wide then return varint(diff(gs, gn, ps, pn)) end
    local s, n = gs - ps, gn - pn
    if n < 0 then s, n = s - 1, n + E9 end
    return varint(s) .. varint(n)
  end
  -- The live entries after the first, as stored: copied only when the
  -- log is written.
  local rest
  local function live_rest()
    if rest then return rest end
    rest = fs and string.sub(blob, after_first) or ''
    if fs and paired ~= (wide and true or false) then
      -- Entries written for another window's size: rewritten in this one's.
      local parts, es, en, ps, pn, pos = {}, fs, fn, fs, fn, after_first
      while pos <= #blob do
        local c2
        es, en, c2, pos = entry(pos, es, en)
        parts[#parts + 1] = gap(es, en, ps, pn) .. varint(c2)
        ps, pn = es, en
      end
      rest = table.concat(parts)
    end
    return rest
  end
  local function encode(extra)
    local body, last_s, last_n, sum = '', ls, ln, count
    if fs then body = zero .. varint(fc) .. live_rest() end
    if extra then
      if not fs then
        body = zero .. varint(extra)
      else
        body = body .. gap(ts, tn, ls, ln) .. varint(extra)
      end
      last_s, last_n, sum = ts, tn, count + extra
    end
    if body == '' then return LOG_TAG .. fmt(ts) .. ' ' .. fmt(tn) .. ' ' .. fmt(ts) .. ' ' .. fmt(tn) .. ' 0 ' .. fmt(ts) .. ' ' .. fmt(tn) .. bar end
    return LOG_TAG .. fmt(ts) .. ' ' .. fmt(tn) .. ' ' .. fmt(fs or ts) .. ' ' .. (fs and fmt(fn) or fmt(tn)) .. ' ' .. fmt(sum) .. ' '
      .. fmt(last_s) .. ' ' .. fmt(last_n) .. bar .. body
  end
  -- The oldest live entry whose expiry leaves room for `excess` less: its
  -- time left (the window when none does). Reads only up to it.
  local function wait_for(excess)
    if fs then
      local sum, es, en, c2, pos = fc, fs, fn, fc, after_first
      while true do
        if sum >= excess then return left_of(es, en) end
        if pos > #blob then break end
        es, en, c2, pos = entry(pos, es, en)
        sum = sum + c2
      end
    end
    return wide and X.dur(wide) or W_
  end
  local window = wide and X.dur(wide) or W_
  -- Made only if it is written (a refusal of one check, or a standing):
  -- a refusal among several policies reads the log and writes nothing.
  fresh = function() return encode(nil) end
  left0 = math.max(L - count, 0)
  if count > 0 then idle0 = left_of(ls, ln) end
  if report then
    -- Cut so that the live cost stays at most the ceiling.
    local added = math.max(math.min(cost, report - count), 0)
    local after = count + added
    allowed, remaining, reset = 1, math.max(L - after, 0), window
    if added == 0 then reset = idle0 end
    if added > 0 then new = encode(added) else new = encode(nil) end
    -- The oldest entry (this report last) whose expiry leaves room for 1.
    if after + 1 > L then retry = wait_for(after + 1 - L) end
  elseif count + cost <= L then
    allowed, remaining, reset = 1, L - count - cost, window
    new = encode(cost)
  else
    remaining, retry, reset = left0, wait_for(count + cost - L), idle0
  end
  return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
end

-- Concurrency limit (`cc`): at most L cost held by live leases, each live
-- for D ns after it was taken or last renewed (`algo/lease.rs`). `lease`:
-- "i=ID" for a check taking lease ID, "x=ID" to release it, "w=ID" to renew
-- it. A release or renewal answers whether the lease was live, with the
-- standing after it and the wait of a check of cost 1. `total`: the cost the
-- list holds, from the state's header (nil for a state written before it
-- had one). A call reads only the leases that expired since the key was
-- written (the list is in order of expiry) and, refused, those whose expiry
-- makes room; a release or renewal finds its lease by a plain search.
local function concurrency(L, D, cost, lease, blob, ts, tn, total)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  local function entry(pos) -- the lease at byte `pos`: id, cost, expiry, and the position after it
    local id, c, es, en, next = string.match(blob, '^|(%d+) (%d+) (%d+) (%d+)()', pos)
    return id, tonumber(c), tonumber(es), tonumber(en), next
  end
  if not total then
    total = 0
    for c in string.gmatch(blob, '|%d+ (%d+) ') do total = total + tonumber(c) end
  end
  -- Expired leases (a prefix) leave the list and the total.
  local used, at = total, 1
  while at <= #blob do
    local _, c, es, en, next = entry(at)
    if es > ts or (es == ts and en > tn) then break end -- live: expires > t
    used, at = used - c, next
  end
  local rest = string.sub(blob, at)
  local op, id = string.sub(lease or 'i=0', 1, 1), string.sub(lease or 'i=0', 3)
  local function encode(extra) return LEASE_TAG .. fmt(ts) .. ' ' .. fmt(tn) .. ' ' .. fmt(used) .. rest .. (extra or '') end
  local function last() -- the wait until the last live lease expires
    local es, en = string.match(rest, '.*|%d+ %d+ (%d+) (%d+)$')
    if not es then return 0 end
    return diff(tonumber(es), tonumber(en), ts, tn)
  end
  -- The first expiry at which the freed cost reaches `excess`.
  local function wait_for(excess)
    local freed, pos = 0, at
    while pos <= #blob do
      local _, c, es, en, next = entry(pos)
      freed, pos = freed + c, next
      if freed >= excess then return diff(es, en, ts, tn) end
    end
    return 0
  end
  left0, idle0 = math.max(L - used, 0), last()
  -- Made only if it is written (a refusal, or a standing: `used` is then
  -- as read).
  fresh = function() return encode(nil) end
  if op == 'i' then
    if used + cost <= L then
      allowed, remaining, reset = 1, L - used - cost, idle0
      if cost > 0 then
        local es, en = add(ts, tn, D)
        used = used + cost
        new, reset = encode('|' .. id .. ' ' .. fmt3(cost, es, en)), D
      else new = encode(nil) end
    else
      remaining, retry, reset = left0, wait_for(used + cost - L), idle0
    end
    return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
  end
  -- A release or a renewal: the lease, if live, leaves the list (a renewal
  -- puts it back last, expiring D from now).
  local found = id ~= '0' and string.find(rest, '|' .. id .. ' ', 1, true)
  if found then
    allowed = 1
    local c, next = string.match(rest, '^|%d+ (%d+) %d+ %d+()', found)
    c = tonumber(c)
    rest = string.sub(rest, 1, found - 1) .. string.sub(rest, next)
    if op == 'w' then
      local es, en = add(ts, tn, D)
      rest = rest .. '|' .. id .. ' ' .. fmt3(c, es, en)
    else used = used - c end
  end
  -- `wait_for` reads the list as it is now.
  blob, at = rest, 1
  new = encode(nil)
  remaining, reset = math.max(L - used, 0), last()
  if used + 1 > L then retry = wait_for(used + 1 - L) end
  return allowed, remaining, retry, reset, delay, new, new, remaining, reset
end

-- The checks of the request being decided, fifteen slots each from
-- `checks[18 * (i - 1)]`, reused by the next request: allowed, remaining,
-- retry, reset, whether the delay is over the longest allowed; the state
-- text if charged and the refreshed one (false: none); the standing with no
-- request (remaining, reset); shadow; late; the key was missing and must
-- not be created (2), or missing (1), or there (0); the delay; a refusal's
-- wait for a check of cost 1; the tag its state is written with; the key's
-- ban prefix and how long it is remembered (false: none); the ban's wait;
-- whether the ban began now. One table
-- for the call: tables are most of a check's cost.
local checks = {}

-- A level's number (`1/p` token) from one unit to another: `level · to /
-- from`, rounded up (`up`) or down, all wide.
local function rescale(level, to, from, up)
  local X = wide()
  local scaled = X.mul(level, to)
  if up then return X.ceil(scaled, from) end
  return (X.div(scaled, from))
end

-- A stored state as this check reads it: its text without its tag, when
-- written under this check's tag; converted, when written under other
-- parameters of the same algorithm whose numbers mean the same once
-- rescaled (docs/SPEC.md, "Changed parameters", as `Policy::carry` does:
-- a bucket's tokens, at most the new capacity; a shaper's backlog in time;
-- a debt at most the deepest a report leaves); nil, a new key, when it no
-- longer means the same (another algorithm, a window of another length).
-- Also the length of the tag to skip (a log's or a lease list's text is
-- long: not copied to drop its tag).
local function untag(raw, tag, arg)
  if string.sub(raw, 1, #tag) == tag then return raw, #tag end
  local first = string.byte(raw, 1)
  if first >= 48 and first <= 57 then return raw, 0 end -- written before tags
  local old, rest = string.match(raw, '^([^:]*:)(.*)$')
  local letter = string.sub(tag, 1, 1)
  if not old or string.sub(old, 1, 1) ~= letter then return nil end
  if tag == LOG_TAG or tag == LEASE_TAG then return rest, 0 end
  if letter ~= 't' and letter ~= 'l' then return nil end
  local X = wide()
  local s1, s2, lv = string.match(rest, '^(%d+) (%d+) (%d+)$')
  if not s1 then return nil end
  local size, n, p = wide_params(arg)
  local level = X.W(lv)
  local deepest = string.match(arg, '^%S+ (%d+)')
  deepest = X.mul(X.W(math.min(tonumber(deepest) * 1000, 1125899906842624)), p) -- 2^50, MAX_SIZE
  if letter == 't' then
    local size0, p0 = string.match(old, '^t(%d+),(%d+):$')
    if not size0 then return nil end
    p0 = X.W(p0)
    local full0, full = X.mul(X.W(size0), p0), X.mul(size, p)
    if X.cmp(level, full0) <= 0 then
      level = X.sat(full, rescale(X.sub(full0, level), p, p0, false))
    else
      level = X.add(full, rescale(X.sub(level, full0), p, p0, true))
    end
  else
    local n0 = string.match(old, '^l(%d+):$')
    if not n0 then return nil end
    level = rescale(level, n, X.W(n0), true)
  end
  if X.cmp(level, deepest) > 0 then level = deepest end
  return s1 .. ' ' .. s2 .. ' ' .. X.text(level), 0
end

-- A key's state: its text (`raw`; `true` for a key lost with the store's
-- state, which counts as used up when the loss was found, (gs, gn)), and
-- its numbers: the time it was last seen (s1, s2), then its kind's (s3..s6)
-- and a sliding log's entries (`blob`, from its "|" or "#").
local function load(raw, skip, kind, a, b, c, arg, lost_at_s, lost_at_ns)
  local s1, s2, s3, s4, s5, s6, s7
  local blob = ''
  if raw then
    local bar = string.find(raw, '[|#]', skip + 1)
    if bar then
      -- A log's or a lease list's header: up to seven numbers (older
      -- states have fewer: see `sliding_log` and `concurrency`).
      local a1, a2, a3, a4, a5, a6, a7 = string.match(string.sub(raw, skip + 1, bar - 1),
        '^(%d+) (%d+) ?(%d*) ?(%d*) ?(%d*) ?(%d*) ?(%d*)$')
      s1, s2, s3, s4, s5, s6, s7 = tonumber(a1), tonumber(a2), tonumber(a3), tonumber(a4), tonumber(a5), tonumber(a6), tonumber(a7)
      blob = string.sub(raw, bar)
    else
      if skip > 0 then raw = string.sub(raw, skip + 1) end
      s1, s2, s3, s4, s5, s6 = nums(raw)
    end
  elseif lost_at_s then
    local gs, gn = lost_at_s, lost_at_ns
    raw = true
    if kind == 'tb' then s1, s2, s3 = gs, gn, a * c
    elseif kind == 'lb' then s1, s2, s3 = gs, gn, (a + 1) * c
    elseif kind == 'sl' then s1, s2, s3, s4, blob = gs, gn, gs, gn, '|' .. varint(0) .. varint(a)
    elseif kind == 'cc' then
      -- Leases unknown: the whole limit held, until a lease would expire.
      local es, en = add(gs, gn, b)
      s1, s2, blob = gs, gn, '|0 ' .. fmt3(a, es, en)
    elseif kind == 'fw' and calendar(arg) then
      local ws, wn, _, len = calendar_window(calendar(arg), gs, gn)
      s1, s2, s3, s4, s5, s6 = gs, gn, ws, wn, a, len
    elseif kind == 'fw' or kind == 'sc' then
      local wide = false
      if b >= LIM then wide = select(2, wide_params(arg)) end
      local ws, wn = window_counts(false, b, wide, false, 0, 0, 0, 0, gs, gn)
      s1, s2, s3, s4, s5, s6 = gs, gn, ws, wn, a, 0
    end
  end
  return raw, s1, s2, s3, s4, s5, s6, blob, s7
end

-- One check's algorithm, in doubles or, when its quantities may outgrow
-- them, in wide integers: allowed, remaining, retry, reset, delay, the
-- state text if charged (`new`) and the refreshed one if not (`fresh`), and
-- the standing with no request (remaining, reset).
local function algorithm(arg, kind, a, b, c, cost, report, standing, raw, s1, s2, s3, s4, s5, s6, blob, ts, tn, lease, s7)
  local wide = is_wide(kind, a, b, c, s3, s5, s6, cost, report)
  local wb, wc
  if wide then wb, wc = select(2, wide_params(arg)) end
  if kind == 'tb' or kind == 'lb' then
    if not wide then
      local level = drained(raw, s1, s2, s3, b, ts, tn)
      if kind == 'tb' then return token_bucket(a, b, c, cost, report, standing, level, ts, tn) end
      return leaky_bucket(a, b, c, cost, report, level, ts, tn)
    end
    local X, level = wide_lib, nil
    if raw == true then level = X.mul(X.W(kind == 'lb' and a + 1 or a), wc)
    elseif raw then level = X.W(string.match(raw, '^%d+ %d+ (%d+)') or '0') end
    level = X.drained(raw, s1, s2, level, wb, ts, tn)
    if kind == 'tb' then return X.token_bucket(a, wb, wc, cost, report, standing, level, ts, tn) end
    return X.leaky_bucket(a, wb, wc, cost, report, level, ts, tn)
  elseif kind == 'fw' and calendar(arg) then
    local ss, sn, left, len = calendar_window(calendar(arg), ts, tn, raw and s3, s4, s6)
    local cur = 0
    if raw and s3 == ss and s4 == sn then cur = s5 end
    return fixed_window(a, cost, report, ss, sn, left, cur, ts, tn, ' ' .. fmt(len))
  elseif kind == 'fw' then
    local ss, sn, left, cur = window_counts(false, b, wide and wb, raw, s3, s4, s5, s6, ts, tn)
    if wide then left = wide_lib.dur(left) end
    return fixed_window(a, cost, report, ss, sn, left, cur, ts, tn)
  elseif kind == 'sc' then
    local ss, sn, left, cur, prev = window_counts(true, b, wide and wb, raw, s3, s4, s5, s6, ts, tn)
    if wide then return wide_lib.sliding_counter(a, wb, cost, report, ss, sn, left, cur, prev, ts, tn) end
    return sliding_counter(a, b, cost, report, ss, sn, left, cur, prev, ts, tn)
  elseif kind == 'sl' then
    return sliding_log(a, b, wide and wb, cost, report, raw, s3, s4, blob, ts, tn, s5, s6, s7)
  elseif kind == 'cc' then
    return concurrency(a, b, cost, lease, blob, ts, tn, s3)
  end
  error('weir: unknown policy kind ' .. tostring(kind))
end

-- A state's text, made now if it was left to be made when written.
local function text(t)
  if type(t) == 'function' then return t() end
  return t
end

-- Charges (or refreshes) the keys of a request of `n` checks, KEYS[k + i],
-- as `all` says, and writes its answer to `out` after position `no`;
-- returns the new end.
local function commit(k, n, all, blocked, lost, redis_time, out, no)
  out[no + 1], out[no + 2] = math.max(all, 0), lost
  no = no + 2
  for i = 1, n do
    local c = 19 * (i - 1)
    local allowed, remaining, reset, delay = checks[c + 1], checks[c + 2], checks[c + 4], checks[c + 13]
    local refused = allowed == 0 or checks[c + 5]
    local stored = false
    local ban = checks[c + 16] and { checks[c + 16], checks[c + 17] }
    if all == 1 and checks[c + 6] and not (checks[c + 10] and refused) then
      store(KEYS[k + i], checks[c + 15], checks[c + 6], reset, redis_time, ban)
      stored = true
    elseif (all == 0 and n == 1 or checks[c + 19]) and allowed == 0 and not blocked then
      -- A rejection refreshes accounting; a ban begun is kept, whatever
      -- else the request held (a shadow policy's too: decided as if
      -- enforced).
      store(KEYS[k + i], checks[c + 15], text(checks[c + 7]), reset, redis_time, ban)
      stored = true
    end
    if all == 0 and allowed == 1 then remaining, reset = checks[c + 8], checks[c + 9] end
    local created = 0
    if checks[c + 12] == 2 then created = 2
    elseif stored and checks[c + 12] == 1 and positive(reset) then created = 1 end
    out[no + 1], out[no + 2], out[no + 3] = allowed, remaining, reply(checks[c + 3])
    out[no + 4], out[no + 5], out[no + 6] = reply(reset), reply(delay), checks[c + 11]
    out[no + 7], out[no + 8], out[no + 9] = created, reply(checks[c + 14]), checks[c + 18]
    out[no + 10] = (checks[c + 19] and not blocked) and 1 or 0
    no = no + 10
  end
  return no
end

-- Decides one request: its checks are KEYS[k + i] and ARGV[a + i], i = 1..n;
-- writes its answer to `out` after position `no`, and returns the new end.
local function decide(k, a, n, mode, time_s, time_ns, out, no)
  local now_s, now_ns
  local redis_time = time_s == 'r'
  if redis_time then
    if not redis_s then
      local t = redis.call('TIME')
      redis_s, redis_ns = tonumber(t[1]), tonumber(t[2]) * 1000
    end
    now_s, now_ns = redis_s, redis_ns
  else
    now_s, now_ns = tonumber(time_s), tonumber(time_ns)
  end

  local peek = mode == 'peek'
  local max_delay = tonumber(mode) or 0
  local lost, gs, gn = 0, nil, nil
  if marker then
    if marker_value == nil then marker_value = redis.call('GET', marker) end
    if marker_value then gs, gn = nums(marker_value)
    else
      lost, gs, gn = 1, now_s, now_ns
      if not peek then
        marker_value = fmt(now_s) .. ' ' .. fmt(now_ns)
        redis.call('SET', marker, marker_value)
      end
    end
  end

  for i = 1, n do
    local arg = ARGV[a + i]
    local kind, a, b, c, cost, empty, shadow, report, no_new, lease, tag, probe, penalty = parse(arg)
    local standing = cost == 0 or n > 1
    local raw = redis.call('GET', KEYS[k + i])
    local ban -- until_s, until_ns, level, at_s, at_ns
    if raw and string.byte(raw, 1) == 33 then -- '!'
      local e = string.find(raw, ';', 2, true)
      local x1, x2, x3, x4, x5 = string.match(string.sub(raw, 2, e - 1), '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
      ban = { tonumber(x1), tonumber(x2), tonumber(x3), tonumber(x4), tonumber(x5) }
      raw = string.sub(raw, e + 1)
    end
    local skip = 0
    if raw then raw, skip = untag(raw, tag, arg) end
    local missing = 0
    if not raw then missing = no_new and 2 or 1 end
    local s1, s2, s3, s4, s5, s6, blob, s7
    raw, s1, s2, s3, s4, s5, s6, blob, s7 = load(raw, skip, kind, a, b, c, arg, empty and gs, gn)
    local ts, tn = now_s, now_ns
    if raw then ts, tn = later(now_s, now_ns, s1, s2) end
    local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 =
      algorithm(arg, kind, a, b, c, cost, report, standing, raw, s1, s2, s3, s4, s5, s6, blob, ts, tn, lease, s7)
    local on_lease = lease and string.sub(lease, 1, 1) ~= 'i'
    if cost == 0 and not report and not on_lease then
      -- Charges nothing: the standing, or a refusal while in debt. It moves
      -- the key's latest time, as any check does.
      if allowed == 1 then remaining, retry, reset, delay = left0, 0, idle0, 0 end
      new = text(fresh)
    end
    if probe and not report then
      -- Answered as the check, charging nothing but the key's latest time.
      local f = select(7, algorithm(arg, kind, a, b, c, 0, false, true, raw, s1, s2, s3, s4, s5, s6, blob, ts, tn, nil, s7))
      delay, new, fresh = 0, text(f), f
    end
    local ban_text, ban_ttl, banned, began = false, 0, 0, false
    if ban and not penalty then
      -- Told no penalty (a lease's release or renewal, or a policy whose
      -- penalty was removed): the ban is kept as it is, for as long as it was.
      local keep = redis.call('PTTL', KEYS[k + i])
      if keep > 0 then
        ban_text, ban_ttl = string.format('!%d %d %d %d %d;', ban[1], ban[2], ban[3], ban[4], ban[5]), keep * 1000000
      end
    elseif penalty then
      local us, un, lv, bs, bn
      if ban then us, un, lv, bs, bn = ban[1], ban[2], ban[3], ban[4], ban[5] end
      local wait = 0
      if us and (us > ts or (us == ts and un > tn)) then wait = diff(us, un, ts, tn) end
      if wait == 0 and allowed == 0 and not report and not peek and not on_lease then
        -- Refused by the policy: the next ban, longer within the memory.
        local B, F, X, M = penalty[1], penalty[2], penalty[3], penalty[4]
        if bs and diff(ts, tn, bs, bn) < M then lv = lv + 1 else lv = 1 end
        local len = B
        if F > 1 then
          for _ = 2, math.min(lv, 64) do len = len * F; if len >= X then break end end
        end
        len = math.min(len, X)
        us, un = add(ts, tn, len)
        bs, bn, wait, began = ts, tn, len, true
      end
      if wait > 0 and not report and not on_lease then
        -- Banned: refused, nothing charged; the waits at least the ban's.
        local own = (allowed == 1) and 0 or retry
        local _, _, _, _, _, _, f, _, zero = algorithm(arg, kind, a, b, c, 0, false, true, raw, s1, s2, s3, s4, s5, s6, blob, ts, tn, nil, s7)
        allowed, remaining, delay, new, fresh = 0, 0, 0, false, f
        retry, reset = at_least(wait, own), at_least(wait, zero)
      elseif wait > 0 then
        retry, reset = at_least(wait, retry), at_least(wait, reset)
      end
      banned = wait
      if bs then
        local fs, fn = later(us, un, add(bs, bn, penalty[4]))
        if fs > ts or (fs == ts and fn > tn) then
          ban_text, ban_ttl = string.format('!%d %d %d %d %d;', us, un, lv, bs, bn), diff(fs, fn, ts, tn)
        end
      end
    end
    -- Refused at a cost above 1: also the wait until a check of cost 1
    -- fits, until which the key's remaining stays 0 (the refusal cache's
    -- promise for this cost holds until then).
    local wait1 = 0
    if allowed == 0 and cost > 1 and not report and not lease then
      local a1, _, r1 = algorithm(arg, kind, a, b, c, 1, false, false, raw, s1, s2, s3, s4, s5, s6, blob, ts, tn, nil, s7)
      if a1 == 0 then wait1 = r1 end
    end
    local c = 19 * (i - 1)
    checks[c + 14] = wait1
    checks[c + 16], checks[c + 17], checks[c + 18], checks[c + 19] = ban_text, ban_ttl, banned, began
    checks[c + 1], checks[c + 2], checks[c + 3], checks[c + 4] = allowed, remaining, retry, reset
    checks[c + 5], checks[c + 6], checks[c + 7] = over(delay, max_delay, mode), new or false, fresh or false
    checks[c + 8], checks[c + 9], checks[c + 10] = left0, idle0, shadow
    checks[c + 11], checks[c + 12] = diff(ts, tn, now_s, now_ns), missing
    checks[c + 13], checks[c + 15] = delay, tag
  end

  local all, blocked = 1, false
  for i = 1, n do
    local c = 19 * (i - 1)
    if not checks[c + 10] and (checks[c + 1] == 0 or checks[c + 5]) then all = 0 end
    if checks[c + 12] == 2 then all, blocked = 0, true end
  end
  if peek then all = -1 end
  return commit(k, n, all, blocked, lost, redis_time, out, no)
end

-- The last request header "N MODE TIME" (TIME: "r" or "S NS") and its
-- parts: a batch on the Redis clock repeats one header.
local head_arg, head_n, head_mode, head_s, head_ns
local function header(arg)
  if arg ~= head_arg then
    local n
    n, head_mode, head_s, head_ns = string.match(arg, '^(%d+) (%S+) (%S+) ?(%S*)$')
    head_arg, head_n = arg, tonumber(n)
  end
  return head_n, head_mode, head_s, head_ns
end

local out, no, k, a = {}, 0, 0, 1
while a < #ARGV do
  local n, mode, time_s, time_ns = header(ARGV[a + 1])
  no = decide(k, a + 1, n, mode, time_s, time_ns, out, no)
  k, a = k + n, a + 1 + n
end
return out
