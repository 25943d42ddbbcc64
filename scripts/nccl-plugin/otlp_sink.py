"""A loopback OTLP/HTTP receiver for the GPU check: saves every POST body under a directory."""
import http.server, os, sys, itertools
out = sys.argv[2]; os.makedirs(out, exist_ok=True); n = itertools.count()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(os.path.join(out, f"{next(n):05d}{self.path.replace('/', '_')}.pb"), "wb") as f:
            f.write(body)
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
