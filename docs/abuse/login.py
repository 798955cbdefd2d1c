"""A login service for weir's abuse example: POST /login answers 200 when
the x-password header is "hunter2", and 401 to anything else.

    python3 docs/abuse/login.py 9000
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Login(BaseHTTPRequestHandler):
    def do_POST(self):
        right = self.headers.get("x-password") == "hunter2"
        body = b"welcome\n" if right else b"wrong password\n"
        self.send_response(200 if right else 401)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
ThreadingHTTPServer(("127.0.0.1", port), Login).serve_forever()
