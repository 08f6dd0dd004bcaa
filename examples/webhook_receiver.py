#!/usr/bin/env python3
"""A Caisse webhook receiver, Python 3 standard library only (http.server, hmac, hashlib).

    CAISSE_SECRET_KEY=sk_test_... python3 examples/webhook_receiver.py 8000

It answers every POST (any path):
- 401 when X-Service-Signature is not "sha256=" + hex(HMAC-SHA256(secret key, timestamp + "." + raw body)),
  or when webhook-signature (Standard Webhooks) holds no "v1," + base64(HMAC-SHA256(secret key,
  webhook-id + "." + timestamp + "." + raw body));
- 400 when a timestamp is missing, not Unix seconds, or more than 300 s from now (either way), or webhook-id
  is missing;
- 400 when the (authentic) body is not the expected JSON;
- 200 {"received": true} otherwise, printing one line per new notification; a duplicate (the same
  webhook-id, which retries make normal) is acknowledged again and not processed twice.

The secret key comes from CAISSE_SECRET_KEY; the port from the first argument, else PORT, else 8000;
the address from HOST (default 127.0.0.1). See examples/README.md.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_S = 300
MAX_BODY = 1024 * 1024

# Handled notifications, by webhook-id (the notification's evt_ id, the same on every attempt; a payment may
# send payment.refunded more than once, so event + reference is not a key). Kept in memory for this example
# only: lost on restart and not shared between processes. A real receiver keeps it in its database (a unique
# key on the id), written in the same transaction as the work the notification triggers.
seen = set()
seen_lock = threading.Lock()


def check(secret_key, signature, timestamp, raw_body, now):
    """None if the delivery is authentic and fresh, else (status, reason). Same order as Caisse's verify()."""
    if not re.fullmatch(r"[0-9]{1,19}", timestamp.strip()):
        return 400, "X-Service-Timestamp is not a Unix time in seconds"
    message = timestamp.strip().encode() + b"." + raw_body
    expected = "sha256=" + hmac.new(secret_key.encode(), message, hashlib.sha256).hexdigest()
    # compare_digest is constant-time.
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        return 401, "invalid signature"
    if abs(now - int(timestamp)) > TOLERANCE_S:
        return 400, "timestamp more than 300 seconds away from now"
    return None


def check_standard(secret_key, webhook_id, signatures, timestamp, raw_body):
    """None if webhook-signature holds a valid v1 entry for this id, timestamp and body, else (status, reason).

    The key is the secret key's UTF-8 bytes (a Standard Webhooks library takes it as "whsec_" + base64 of
    them). Several space-separated entries may come during a key roll: one valid is enough."""
    if not webhook_id:
        return 400, "webhook-id is missing"
    if not re.fullmatch(r"[0-9]{1,19}", timestamp.strip()):
        return 400, "webhook-timestamp is not a Unix time in seconds"
    message = webhook_id.encode() + b"." + timestamp.strip().encode() + b"." + raw_body
    digest = hmac.new(secret_key.encode(), message, hashlib.sha256).digest()
    expected = ("v1," + base64.b64encode(digest).decode()).encode()
    if not any(hmac.compare_digest(expected, given.encode()) for given in signatures.split()):
        return 401, "invalid webhook-signature"
    return None


class WebhookHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    secret_key = ""

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self.answer(411, {"error": "Content-Length required"})
        if length < 0 or length > MAX_BODY:
            return self.answer(413, {"error": "body too large"})
        # The raw body, exactly as received: the signature is checked over these bytes, never over
        # json.dumps(json.loads(raw)), whose bytes differ (see examples/README.md).
        raw = self.rfile.read(length)

        problem = check(
            self.secret_key,
            self.headers.get("X-Service-Signature", ""),
            self.headers.get("X-Service-Timestamp", ""),
            raw,
            int(time.time()),
        )
        # The Standard Webhooks headers: the same proof in another form, and the id to deduplicate on.
        webhook_id = self.headers.get("webhook-id", "")
        problem = problem or check_standard(
            self.secret_key,
            webhook_id,
            self.headers.get("webhook-signature", ""),
            self.headers.get("webhook-timestamp", ""),
            raw,
        )
        if problem:
            status, reason = problem
            return self.answer(status, {"error": reason})

        # Authentic bytes: only now parse them.
        try:
            notification = json.loads(raw)
            event = notification["event"]
            data = notification["data"]
            reference = data["reference"]
            if not isinstance(event, str) or not isinstance(reference, str):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return self.answer(400, {"error": "missing event or data.reference"})

        with seen_lock:
            first_time = webhook_id not in seen
            seen.add(webhook_id)
        if first_time:
            # The work goes here (mark the order paid, ...). Keep it short: Caisse waits 10 s for the 200,
            # so longer work belongs in a queue. If it fails, forget the event and answer 500 so Caisse retries.
            print(f"{event} {reference} statut={data.get('statut')} montant={data.get('montant')} {data.get('devise')}"
                  f" id={webhook_id}", flush=True)
        return self.answer(200, {"received": True})

    def answer(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        # Keep stdout for accepted events; requests are not logged.
        pass


def main():
    secret_key = os.environ.get("CAISSE_SECRET_KEY", "")
    if not secret_key:
        print("set CAISSE_SECRET_KEY to the merchant's secret key (sk_test_... or sk_live_...)", file=sys.stderr)
        return 2
    port_text = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PORT", "8000")
    try:
        port = int(port_text)
    except ValueError:
        print(f"the port must be a number, got {port_text!r}", file=sys.stderr)
        return 2
    host = os.environ.get("HOST", "127.0.0.1")
    WebhookHandler.secret_key = secret_key
    server = ThreadingHTTPServer((host, port), WebhookHandler)
    print(f"webhook receiver listening on http://{host}:{port}/", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
