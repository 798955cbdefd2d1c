"""What one call of weir.lua costs Redis on a key that holds many entries:
a refused check on a sliding log of 1,000 entries, and a refused check, a
bogus renewal and a live renewal on a lease list of 1,500 leases; beside a
token-bucket check, the cost of a call of the script at all. Each figure is
Redis's own (INFO commandstats, usec_per_call), so the client's speed does
not enter it. Usage: script-cost.py PORT SCRIPT [LABEL]"""
import sys

import redis

port, path = int(sys.argv[1]), sys.argv[2]
label = sys.argv[3] if len(sys.argv) > 3 else path
r = redis.Redis(port=port)
sha = r.script_load(open(path).read())
HOUR = 3600 * 10**9


def per_call(key, calls):
    r.config_resetstat()
    for args in calls:
        r.evalsha(sha, 1, key, "-", *args)
    return r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]


def at(s, ns=0):
    return f"1 0 {s} {ns}"


rows = []
r.delete("cost:tb")
rows.append(("token-bucket check", per_call("cost:tb", [(at(1000 + i), "tb 10 1 1000000000") for i in range(1000)])))
r.delete("cost:sl")
per_call("cost:sl", [(at(1000, i * 10**6), f"sl 1000 {HOUR}") for i in range(1000)])
rows.append(("sliding log, 1,000 entries: refused check (cost 2)", per_call("cost:sl", [(at(1001, i * 10**5), f"sl 1000 {HOUR} c=2") for i in range(2000)])))
r.delete("cost:tb2")
both = lambda i: ("2 0 %d %d" % (1002, i * 10**5), f"sl 1000 {HOUR}", "tb 1000000 1 1000")
r.config_resetstat()
for i in range(2000):
    r.evalsha(sha, 2, "cost:sl", "cost:tb2", "-", *both(i))
rows.append(("sliding log, 1,000 entries, and a token bucket: refused request", r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
r.delete("cost:cc")
per_call("cost:cc", [(at(1000), f"cc 1500 {HOUR} i={i + 1}") for i in range(1500)])
rows.append(("1,500 leases: bogus renewal", per_call("cost:cc", [(at(1001), f"cc 1500 {HOUR} w=999999999")] * 1000)))
rows.append(("1,500 leases: refused check", per_call("cost:cc", [(at(1001), f"cc 1500 {HOUR} i={10**6 + i}") for i in range(1000)])))
rows.append(("1,500 leases: live renewal", per_call("cost:cc", [(at(1002), f"cc 1500 {HOUR} w={i + 1}") for i in range(500)])))
for name, usec in rows:
    print(f"| {label} | {name} | {usec:.0f} µs |")
