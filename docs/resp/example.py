"""weir over the Redis protocol, from Python with redis-py (pip install redis).

    weir serve --resp 127.0.0.1:6380 &
    python3 docs/resp/example.py 6380

CL.THROTTLE answers as redis-cell does; WEIR.CHECK decides a policy of
weir's configuration (here the built-in example's `api`: 10 at once, 2 a
second).
"""
import sys

import redis

port = int(sys.argv[1]) if len(sys.argv) > 1 else 6380
r = redis.Redis(host="127.0.0.1", port=port)

# 15 at once, 30 a minute, for user123: limited, limit, remaining,
# retry after (s, -1 when admitted), reset after (s).
limited, limit, remaining, retry_after, reset_after = r.execute_command(
    "CL.THROTTLE", "user123", 15, 30, 60, 1
)
print("CL.THROTTLE", limited, limit, remaining, retry_after, reset_after)

# A named policy: admitted (1/0), remaining, retry after and reset (ms).
for _ in range(12):
    admitted, remaining, retry_ms, reset_ms = r.execute_command("WEIR.CHECK", "api", "me")[:4]
print("WEIR.CHECK", admitted, remaining, retry_ms > 0)
