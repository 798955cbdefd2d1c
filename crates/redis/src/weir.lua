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
--          storing nothing):
--          "tb C n p"  token bucket / GCRA: capacity C, rate reduced to n/p ns
--          "lb Q n p"  leaky bucket: queue Q, rate n/p
--          "fw L W"    fixed window      "sc L W" sliding counter
--          "sl L W"    sliding log       (W in ns)
-- Returns, request after request, {all_allowed, state_lost, then per check:
-- allowed, remaining, retry_after, reset, delay, late, created} (durations
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
-- full. Every number is an exact integer below 2^53 (the policy bounds of
-- weir-core guarantee it); times are (seconds, nanoseconds) pairs, so
-- absolute nanoseconds (~1.8e18) never appear in a double.
--
-- State per key (a string): "seen_s seen_ns ..." then
--   tb/lb: level (1/p token units at seen)
--   fw: start_s start_ns count          sc: start_s start_ns cur prev
--   sl: first_s first_ns | entries (varint gap from the previous, varint cost)

local E9 = 1000000000
local BIG = 9007199254740992 -- 2^53

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
    local spec = {}
    for w in string.gmatch(arg, '%S+') do spec[#spec + 1] = w end
    p = { spec[1], tonumber(spec[2]), tonumber(spec[3]), tonumber(spec[4]), 1, false, false, false, false }
    local flags = (spec[1] == 'tb' or spec[1] == 'lb') and 5 or 4
    for k = flags, #spec do
      if spec[k] == 'e' then p[6] = true
      elseif spec[k] == 's' then p[7] = true
      elseif spec[k] == 'n' then p[9] = true
      elseif string.sub(spec[k], 1, 2) == 'r=' then p[8] = tonumber(string.sub(spec[k], 3))
      elseif string.sub(spec[k], 1, 2) == 'c=' then p[5] = tonumber(string.sub(spec[k], 3)) end
    end
    parsed[arg] = p
  end
  return p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]
end

local function store(key, text, reset, redis_time)
  if redis_time and reset == 0 then
    redis.call('DEL', key)
  elseif redis_time then
    redis.call('SET', key, text, 'PX', math.max(cdiv(reset, 1000000), 1))
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
-- in it, the current count and (a sliding counter's) the previous one.
local function window_counts(sliding, W, raw, s3, s4, s5, s6, ts, tn)
  local ss, sn = window_start(ts, tn, W)
  local left = W - diff(ts, tn, ss, sn)
  local cur, prev = 0, 0
  if raw then
    if s3 == ss and s4 == sn then cur, prev = s5, s6 or 0
    else
      local ps, pn = add(s3, s4, W)
      if sliding and ps == ss and pn == sn then cur, prev = 0, s5 end
    end
  end
  return ss, sn, left, cur, prev
end

-- Fixed window (`fw`): at most L per aligned window.
local function fixed_window(L, cost, report, ss, sn, left, cur, ts, tn)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  left0, idle0 = math.max(L - cur, 0), (cur > 0) and left or 0
  if report then
    local after = math.min(cur + cost, report)
    allowed, remaining, reset = 1, math.max(L - after, 0), (after > 0) and left or 0
    if after + 1 > L then retry = left end
    new = string.format('%d %d %d %d %d', ts, tn, ss, sn, after)
  elseif cur + cost <= L then
    allowed, remaining, reset = 1, L - cur - cost, left
    new = string.format('%d %d %d %d %d', ts, tn, ss, sn, cur + cost)
  else
    remaining, retry, reset = math.max(L - cur, 0), left, (cur > 0) and left or 0
  end
  -- The refreshed state, written only by a rejection or a standing.
  if allowed == 0 or cost == 0 then fresh = string.format('%d %d %d %d %d', ts, tn, ss, sn, cur) end
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
-- window of W ns.
local function sliding_log(L, W, cost, report, raw, s3, s4, blob, ts, tn)
  local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 = 0, 0, 0, 0, 0, nil, nil, 0, 0
  local times, costs = {}, {}
  local count = 0
  if raw and #blob > 0 then
    local es, en = s3, s4
    local pos = 1
    while pos <= #blob do
      local gap, c2
      gap, pos = read_varint(blob, pos)
      c2, pos = read_varint(blob, pos)
      es, en = add(es, en, gap)
      if diff(ts, tn, es, en) < W then -- live: a > t - W
        times[#times + 1] = { es, en }
        costs[#costs + 1] = c2
        count = count + c2
      end
    end
  end
  local function encode(extra)
    local list = {}
    for k = 1, #times do list[#list + 1] = { times[k], costs[k] } end
    if extra then list[#list + 1] = extra end
    if #list == 0 then return fmt(ts) .. ' ' .. fmt(tn) .. ' ' .. fmt(ts) .. ' ' .. fmt(tn) .. '|' end
    local first = list[1][1]
    local parts = { fmt(ts) .. ' ' .. fmt(tn) .. ' ' .. fmt(first[1]) .. ' ' .. fmt(first[2]) .. '|' }
    local ps, pn = first[1], first[2]
    for k = 1, #list do
      local e = list[k]
      parts[#parts + 1] = varint(diff(e[1][1], e[1][2], ps, pn)) .. varint(e[2])
      ps, pn = e[1][1], e[1][2]
    end
    return table.concat(parts)
  end
  fresh = encode(nil)
  left0 = math.max(L - count, 0)
  if #times > 0 then idle0 = W - diff(ts, tn, times[#times][1], times[#times][2]) end
  if report then
    -- Cut so that the live cost stays at most the ceiling.
    local added = math.max(math.min(cost, report - count), 0)
    local after = count + added
    allowed, remaining, reset = 1, math.max(L - after, 0), W
    if added == 0 then reset = idle0 end
    if after + 1 > L then
      -- The oldest entry (this report last) whose expiry leaves room for 1.
      local excess, sum = after + 1 - L, 0
      local found = false
      for k = 1, #times do
        sum = sum + costs[k]
        if sum >= excess then retry = W - diff(ts, tn, times[k][1], times[k][2]); found = true; break end
      end
      if not found then retry = W end
    end
    if added > 0 then new = encode({ { ts, tn }, added }) else new = fresh end
  elseif count + cost <= L then
    allowed, remaining, reset = 1, L - count - cost, W
    new = encode({ { ts, tn }, cost })
  else
    remaining = left0
    local excess, sum = count + cost - L, 0
    for k = 1, #times do
      sum = sum + costs[k]
      if sum >= excess then retry = W - diff(ts, tn, times[k][1], times[k][2]); break end
    end
    local last = times[#times]
    reset = W - diff(ts, tn, last[1], last[2])
  end
  return allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
end

-- The checks of the request being decided, twelve slots each from
-- `checks[12 * (i - 1)]`, reused by the next request: allowed, remaining,
-- retry, reset, delay; the state text if charged and the refreshed one
-- (false: none); the standing with no request (remaining, reset); shadow;
-- late; the key was missing and must not be created (2), or missing (1),
-- or there (0). One table for the call: tables are most of a check's cost.
local checks = {}

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
    local kind, a, b, c, cost, empty, shadow, report, no_new = parse(ARGV[a + i])
    local standing = cost == 0 or n > 1
    local raw = redis.call('GET', KEYS[k + i])
    local missing = 0
    if not raw then missing = no_new and 2 or 1 end
    local s1, s2, s3, s4, s5, s6
    local blob = ''
    if raw then
      local bar = string.find(raw, '|', 1, true)
      if bar then s1, s2, s3, s4 = nums(string.sub(raw, 1, bar - 1)); blob = string.sub(raw, bar + 1)
      else s1, s2, s3, s4, s5, s6 = nums(raw) end
    elseif gs and empty then
      -- Lost: as if used up when the loss was found.
      raw = true
      if kind == 'tb' then s1, s2, s3 = gs, gn, a * c
      elseif kind == 'lb' then s1, s2, s3 = gs, gn, (a + 1) * c
      elseif kind == 'sl' then s1, s2, s3, s4, blob = gs, gn, gs, gn, varint(0) .. varint(a)
      elseif kind == 'fw' or kind == 'sc' then
        local ws, wn = window_start(gs, gn, b)
        s1, s2, s3, s4, s5, s6 = gs, gn, ws, wn, a, 0
      end
    end
    local ts, tn = now_s, now_ns
    if raw then ts, tn = later(now_s, now_ns, s1, s2) end
    -- The decision, the state text if charged (`new`) and the refreshed
    -- one if not (`fresh`), and the standing with no request.
    local allowed, remaining, retry, reset, delay, new, fresh, left0, idle0
    if kind == 'tb' then
      allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 =
        token_bucket(a, b, c, cost, report, standing, drained(raw, s1, s2, s3, b, ts, tn), ts, tn)
    elseif kind == 'lb' then
      allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 =
        leaky_bucket(a, b, c, cost, report, drained(raw, s1, s2, s3, b, ts, tn), ts, tn)
    elseif kind == 'fw' then
      local ss, sn, left, cur = window_counts(false, b, raw, s3, s4, s5, s6, ts, tn)
      allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 =
        fixed_window(a, cost, report, ss, sn, left, cur, ts, tn)
    elseif kind == 'sc' then
      local ss, sn, left, cur, prev = window_counts(true, b, raw, s3, s4, s5, s6, ts, tn)
      allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 =
        sliding_counter(a, b, cost, report, ss, sn, left, cur, prev, ts, tn)
    elseif kind == 'sl' then
      allowed, remaining, retry, reset, delay, new, fresh, left0, idle0 =
        sliding_log(a, b, cost, report, raw, s3, s4, blob, ts, tn)
    else
      error('weir: unknown policy kind ' .. tostring(kind))
    end
    if cost == 0 and not report then
      -- Charges nothing: the standing, or a refusal while in debt. It moves
      -- the key's latest time, as any check does.
      if allowed == 1 then remaining, retry, reset, delay = left0, 0, idle0, 0 end
      new = fresh
    end
    local c = 12 * (i - 1)
    checks[c + 1], checks[c + 2], checks[c + 3], checks[c + 4] = allowed, remaining, retry, reset
    checks[c + 5], checks[c + 6], checks[c + 7] = delay, new or false, fresh or false
    checks[c + 8], checks[c + 9], checks[c + 10] = left0, idle0, shadow
    checks[c + 11], checks[c + 12] = diff(ts, tn, now_s, now_ns), missing
  end

  local all, blocked = 1, false
  for i = 1, n do
    local c = 12 * (i - 1)
    if not checks[c + 10] and (checks[c + 1] == 0 or checks[c + 5] > max_delay) then all = 0 end
    if checks[c + 12] == 2 then all, blocked = 0, true end
  end
  if peek then all = -1 end

  out[no + 1], out[no + 2] = math.max(all, 0), lost
  no = no + 2
  for i = 1, n do
    local c = 12 * (i - 1)
    local allowed, remaining, reset, delay = checks[c + 1], checks[c + 2], checks[c + 4], checks[c + 5]
    local refused = allowed == 0 or delay > max_delay
    local stored = false
    if all == 1 and checks[c + 6] and not (checks[c + 10] and refused) then
      store(KEYS[k + i], checks[c + 6], reset, redis_time)
      stored = true
    elseif all == 0 and n == 1 and allowed == 0 and not blocked then
      store(KEYS[k + i], checks[c + 7], reset, redis_time) -- a rejection refreshes accounting
      stored = true
    end
    if all == 0 and allowed == 1 then remaining, reset = checks[c + 8], checks[c + 9] end
    local created = 0
    if checks[c + 12] == 2 then created = 2
    elseif stored and checks[c + 12] == 1 and reset > 0 then created = 1 end
    out[no + 1], out[no + 2], out[no + 3] = allowed, remaining, checks[c + 3]
    out[no + 4], out[no + 5], out[no + 6] = reset, delay, checks[c + 11]
    out[no + 7] = created
    no = no + 7
  end
  return no
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
