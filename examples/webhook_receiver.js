#!/usr/bin/env node
// A Caisse webhook receiver for Node.js, no dependencies (http, crypto.timingSafeEqual).
//
//     CAISSE_SECRET_KEY=sk_test_... node examples/webhook_receiver.js 8000
//
// It answers every POST (any path):
// - 401 when X-Service-Signature is not "sha256=" + hex(HMAC-SHA256(secret key, timestamp + "." + raw body)),
//   or when webhook-signature (Standard Webhooks) holds no "v1," + base64(HMAC-SHA256(secret key,
//   webhook-id + "." + timestamp + "." + raw body));
// - 400 when a timestamp is missing, not Unix seconds, or more than 300 s from now (either way), or webhook-id
//   is missing;
// - 400 when the (authentic) body is not the expected JSON;
// - 200 {"received": true} otherwise, printing one line per new notification; a duplicate (the same
//   webhook-id, which retries make normal) is acknowledged again and not processed twice.
//
// The secret key comes from CAISSE_SECRET_KEY; the port from the first argument, else PORT, else 8000;
// the address from HOST (default 127.0.0.1). See examples/README.md.
'use strict';

const crypto = require('crypto');
const http = require('http');

const TOLERANCE_S = 300;
const MAX_BODY = 1024 * 1024;

// Handled notifications, by webhook-id (the notification's evt_ id, the same on every attempt; a payment may
// send payment.refunded more than once, so event + reference is not a key). Kept in memory for this example
// only: lost on restart and not shared between processes. A real receiver keeps it in its database (a unique
// key on the id), written in the same transaction as the work the notification triggers.
const seen = new Set();

// null if the delivery is authentic and fresh, else [status, reason]. Same order as Caisse's verify().
function check(secretKey, signature, timestamp, rawBody, now) {
  const ts = timestamp.trim();
  if (!/^[0-9]{1,15}$/.test(ts)) return [400, 'X-Service-Timestamp is not a Unix time in seconds'];
  const expected = Buffer.from(
    'sha256=' +
      crypto
        .createHmac('sha256', secretKey)
        .update(Buffer.concat([Buffer.from(ts + '.'), rawBody]))
        .digest('hex'),
  );
  const given = Buffer.from(signature.trim());
  // timingSafeEqual needs equal lengths; the length of a valid signature is no secret.
  if (given.length !== expected.length || !crypto.timingSafeEqual(given, expected)) {
    return [401, 'invalid signature'];
  }
  if (Math.abs(now - Number(ts)) > TOLERANCE_S) return [400, 'timestamp more than 300 seconds away from now'];
  return null;
}

// null if webhook-signature holds a valid v1 entry for this id, timestamp and body, else [status, reason].
// The key is the secret key's UTF-8 bytes (a Standard Webhooks library takes it as "whsec_" + base64 of them).
// Several space-separated entries may come during a key roll: one valid is enough.
function checkStandard(secretKey, webhookId, signatures, timestamp, rawBody) {
  if (!webhookId) return [400, 'webhook-id is missing'];
  const ts = timestamp.trim();
  if (!/^[0-9]{1,15}$/.test(ts)) return [400, 'webhook-timestamp is not a Unix time in seconds'];
  const digest = crypto
    .createHmac('sha256', secretKey)
    .update(Buffer.concat([Buffer.from(webhookId + '.' + ts + '.'), rawBody]))
    .digest('base64');
  const expected = Buffer.from('v1,' + digest);
  const valid = signatures
    .split(' ')
    .map((given) => Buffer.from(given))
    .some((given) => given.length === expected.length && crypto.timingSafeEqual(given, expected));
  return valid ? null : [401, 'invalid webhook-signature'];
}

function answer(res, status, payload) {
  const body = JSON.stringify(payload);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

function handle(secretKey, req, res) {
  if (req.method !== 'POST') return answer(res, 405, { error: 'POST only' });
  const chunks = [];
  let size = 0;
  req.on('data', (chunk) => {
    size += chunk.length;
    if (size > MAX_BODY) {
      answer(res, 413, { error: 'body too large' });
      req.destroy();
    } else {
      chunks.push(chunk);
    }
  });
  req.on('end', () => {
    // The raw body, exactly as received (a Buffer, not a string and never JSON.stringify(JSON.parse(...))):
    // the signature is checked over these bytes (see examples/README.md).
    const raw = Buffer.concat(chunks);
    const problem = check(
      secretKey,
      req.headers['x-service-signature'] || '',
      req.headers['x-service-timestamp'] || '',
      raw,
      Math.floor(Date.now() / 1000),
    );
    // The Standard Webhooks headers: the same proof in another form, and the id to deduplicate on.
    const webhookId = req.headers['webhook-id'] || '';
    const standard =
      problem ||
      checkStandard(
        secretKey,
        webhookId,
        req.headers['webhook-signature'] || '',
        req.headers['webhook-timestamp'] || '',
        raw,
      );
    if (standard) return answer(res, standard[0], { error: standard[1] });

    // Authentic bytes: only now parse them.
    let notification;
    try {
      notification = JSON.parse(raw.toString('utf8'));
    } catch (e) {
      return answer(res, 400, { error: 'body is not JSON' });
    }
    const data = notification && notification.data;
    const event = notification && notification.event;
    const reference = data && data.reference;
    if (typeof event !== 'string' || typeof reference !== 'string') {
      return answer(res, 400, { error: 'missing event or data.reference' });
    }

    if (!seen.has(webhookId)) {
      seen.add(webhookId);
      // The work goes here (mark the order paid, ...). Keep it short: Caisse waits 10 s for the 200, so
      // longer work belongs in a queue. If it fails, forget the event and answer 500 so Caisse retries.
      console.log(`${event} ${reference} statut=${data.statut} montant=${data.montant} ${data.devise} id=${webhookId}`);
    }
    return answer(res, 200, { received: true });
  });
}

function main() {
  const secretKey = process.env.CAISSE_SECRET_KEY || '';
  if (!secretKey) {
    console.error("set CAISSE_SECRET_KEY to the merchant's secret key (sk_test_... or sk_live_...)");
    process.exit(2);
  }
  const portText = process.argv[2] || process.env.PORT || '8000';
  const port = Number(portText);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`the port must be a number, got ${JSON.stringify(portText)}`);
    process.exit(2);
  }
  const host = process.env.HOST || '127.0.0.1';
  const server = http.createServer((req, res) => handle(secretKey, req, res));
  server.listen(port, host, () => console.error(`webhook receiver listening on http://${host}:${port}/`));
}

main();
