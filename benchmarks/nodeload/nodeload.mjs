#!/usr/bin/env node
// nodeload: a closed-loop HTTP/2 load generator on Node's built-in node:http2, the stack undici's HTTP/2 client
// is built on, for compare.sh's protocols and tls phases. Node 20 or later, built-in modules only.
//
// --mode get: each of -c sessions keeps -m GET requests of --path in flight, the next sent as one ends. An answer
// counts when it arrived whole with status 200 and, with --expect-bytes, exactly that many body bytes; for
// /download/{kib} every byte is checked too (byte i is i % 251, the sample's pattern), against a buffer made once.
//
// --mode grpc-bidi: each session opens -m bidirectional streaming calls (POST --path, application/grpc,
// te: trailers). Each call keeps one message in flight: a gRPC frame (flag 0, 4-byte big-endian length, --size
// bytes naming the call and the message's sequence number), and the next only once the echo is back, compared
// byte for byte with the frame sent, across however many DATA chunks it comes in (bytes beyond the message in
// flight, a second message arriving with it included, are an error). At the end each call ends its stream and
// must be answered with grpc-status 0 in the trailers.
//
// Sessions (and in grpc-bidi each call's first echo, which brings its response headers) are set up before the
// clock starts; answers to requests sent and verified inside the -d second window are the "requests", their
// latencies exact to the microsecond up to 100 ms. Then in-flight work gets up to 2 s to finish, everything is
// closed and the process exits; a hard timeout exits 3 if anything hangs. Output: one JSON line on stdout in
// wsload's shape (WRK_RESULT's of benchmarks/lib/pipeline.lua). Exit 1 when no session could be set up, 2 on bad
// usage. Errors carry wsload's keys; benchmarks/nodeload/README.md says which failure counts where.
//
// Run: node nodeload.mjs --mode get|grpc-bidi --url http(s)://127.0.0.1:PORT [--path /x] [-c 4] [-m 16] [-d 3]
//                        [--size 32] [--expect-bytes N]
// https:// is TLS with ALPN h2, the certificate not verified; http:// is h2c with prior knowledge.

import http2 from 'node:http2';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';

const SETUP_MS = 5000;              // every session (and call) set up within this, or it runs without them
const DRAIN_MS = 2000;              // how long in-flight work and the calls' ends may take after the window
const TIMEOUT_MS = 1000;            // in flight this long when the window ends: a timeout
const LAT_BUCKETS = 100000;         // 1 us each: exact up to 100 ms, everything slower in the last one
const STREAM_WINDOW = 256 * 1024;   // undici's defaults (initialWindowSize, connectionWindowSize), larger than Node's
const CONNECTION_WINDOW = 512 * 1024;
const MAX_MESSAGE = 4 * 1024 * 1024 - 5;   // gRPC's default limit on a received message, with its 5-byte prefix

const USAGE = 'usage: node nodeload.mjs --mode get|grpc-bidi --url http(s)://HOST:PORT [--path PATH] [-c CONNECTIONS]\n'
    + '         [-m STREAMS] [-d SECONDS] [--size BYTES (grpc-bidi)] [--expect-bytes N (get)]\n';

function die(message, code = 1) {
    process.stderr.write(`nodeload: ${message}\n`);
    process.exit(code);
}

// ---- options -----------------------------------------------------------------------------------

let opts;
try {
    opts = parseArgs({
        options: {
            mode: { type: 'string' },
            url: { type: 'string' },
            path: { type: 'string' },
            connections: { type: 'string', short: 'c', default: '4' },
            streams: { type: 'string', short: 'm', default: '16' },
            duration: { type: 'string', short: 'd', default: '3' },
            size: { type: 'string' },
            'expect-bytes': { type: 'string' },
        },
    }).values;
} catch (e) {
    die(`${e.message}\n${USAGE}`, 2);
}
const integer = (text, min, max) => (/^\d+$/.test(text) && +text >= min && +text <= max ? +text : NaN);
const mode = opts.mode;
const grpc = mode === 'grpc-bidi';
const connections = integer(opts.connections, 1, 10000);
const streams = integer(opts.streams, 1, 10000);
const duration = Number(opts.duration);
const size = grpc ? integer(opts.size ?? '32', 0, MAX_MESSAGE) : 0;
const expectBytes = opts['expect-bytes'] === undefined ? undefined : integer(opts['expect-bytes'], 0, 2 ** 40);
let origin;
try {
    origin = new URL(opts.url ?? '');
} catch {
    origin = null;
}
if ((mode !== 'get' && !grpc) || !origin || !['http:', 'https:'].includes(origin.protocol) || Number.isNaN(connections)
    || Number.isNaN(streams) || !(duration > 0) || Number.isNaN(size) || Number.isNaN(expectBytes)
    || (grpc && expectBytes !== undefined) || (!grpc && opts.size !== undefined)) {
    die(`bad options\n${USAGE}`, 2);
}
const path = opts.path ?? (grpc ? '/techempower.Echo/Bidi' : '/json');
if (!path.startsWith('/')) die(`--path must start with /\n${USAGE}`, 2);

// /download/{kib}: the body the sample writes, to compare every chunk against.
const kib = /^\/download\/(\d+)$/.exec(path);
const content = kib ? Buffer.alloc(+kib[1] * 1024, 0) : null;
for (let i = 0; content && i < content.length; i++) content[i] = i % 251;

const CONNECT_OPTIONS = {
    rejectUnauthorized: false,    // the sample's certificate is self-signed
    ALPNProtocols: ['h2'],
    settings: { enablePush: false, initialWindowSize: STREAM_WINDOW },
    maxSessionMemory: 64,         // MiB: room for many large answers in flight
};
const GET_HEADERS = { ':method': 'GET', ':path': path };
const GRPC_HEADERS = { ':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers' };

// ---- counters ----------------------------------------------------------------------------------

let phase = 'setup';                               // 'setup', 'run' (the window), 'stop' (the drain)
let windowStart = Infinity, windowEnd = Infinity;  // answers verified in [start, end) are counted
let requests = 0, bytesIn = 0, lastError = null;
const errors = { connect: 0, read: 0, write: 0, status: 0, parse: 0, closed: 0, close: 0, timeout: 0 };
const latCounts = new Uint32Array(LAT_BUCKETS);
let latTotal = 0, latMax = 0, latSum = 0;

// An answer verified inside the window, to a request sent inside it (not a call's first message, sent at set-up).
function record(now, sentAt) {
    if (sentAt < windowStart || now >= windowEnd) return;
    requests++;
    const us = Math.floor((now - sentAt) * 1000);
    latCounts[us < LAT_BUCKETS ? us : LAT_BUCKETS - 1]++;
    latTotal++;
    latSum += us;
    if (us > latMax) latMax = us;
}

function percentile(p) {
    const rank = Math.max(1, Math.ceil((p / 100) * latTotal));
    let seen = 0;
    for (let b = 0; b < LAT_BUCKETS; b++) {
        seen += latCounts[b];
        if (seen >= rank) return b < LAT_BUCKETS - 1 ? b : latMax;
    }
    return latMax;
}

const running = (now) => phase === 'run' && now < windowEnd;

// ---- sessions ----------------------------------------------------------------------------------
// A connection has one session at a time; one that fails during the window is counted and opened again, so the
// load goes on. A session's streams belong to it: an event of a stream of a session since replaced is ignored.

const conns = Array.from({ length: connections }, (_, index) => ({
    index, session: null, ready: false, broken: false, slots: null,
}));

function openSession(conn, settled) {
    const session = http2.connect(origin.origin, CONNECT_OPTIONS);
    conn.session = session;
    conn.ready = conn.broken = false;
    session.on('connect', () => {
        if (conn.session !== session) return;
        conn.ready = true;
        session.setLocalWindowSize(CONNECTION_WINDOW);
        if (phase === 'setup') setUp(conn, settled);
        else if (phase === 'run') startWork(conn, performance.now());
    });
    session.on('error', (e) => {
        lastError = e;
        if (conn.session !== session || conn.broken) return;
        if (!conn.ready) errors.connect++;
        else {
            conn.broken = true;
            if (phase === 'stop') errors.close++;
            else errors.read++;
        }
    });
    session.on('goaway', (code) => {   // the server leaving: a clean GOAWAY is "closed", as in wsload
        if (conn.session !== session || conn.broken || phase === 'stop') return;
        conn.broken = true;
        if (code === http2.constants.NGHTTP2_NO_ERROR) errors.closed++;
        else errors.read++;
    });
    session.on('close', () => {
        if (conn.session !== session) return;
        if (conn.ready && !conn.broken && phase !== 'stop') errors.closed++;
        conn.session = null;
        conn.ready = false;
        if (phase === 'setup') settled?.(false);
        else if (phase === 'run') setTimeout(() => phase === 'run' && !conn.session && openSession(conn), 10);
    });
}

const live = (conn, session) => phase !== 'stop' && conn.session === session && conn.ready && !conn.broken
    && !session.closed && !session.destroyed;

// ---- get: m requests in flight per session --------------------------------------------------------
// Each slot is one request at a time; its handlers are shared functions (this = the stream, stream.slot = its
// slot), so a request allocates nothing of ours beyond what node:http2 does.

function issue(slot, now) {
    const { conn } = slot;
    const session = conn.session;
    let stream;
    try {
        stream = session.request(GET_HEADERS, { endStream: true });
    } catch (e) {   // the session is going away: its close starts the connection over
        lastError = e;
        return;
    }
    stream.slot = slot;
    slot.stream = stream;
    slot.session = session;
    slot.sentAt = now;
    slot.status = 0;
    slot.got = 0;
    slot.bad = false;
    slot.done = false;
    stream.on('response', onGetResponse);
    stream.on('data', onGetData);
    stream.on('end', onGetEnd);
    stream.on('error', onStreamError);
    stream.on('close', onGetClose);
}

function onGetResponse(headers) {
    this.slot.status = headers[':status'];
}

function onGetData(chunk) {
    const slot = this.slot;
    if (slot.stream !== this) return;
    const now = performance.now();
    if (now >= windowStart && now < windowEnd) bytesIn += chunk.length;
    if (content && !slot.bad) {
        const end = slot.got + chunk.length;
        slot.bad = end > content.length || chunk.compare(content, slot.got, end) !== 0;
    }
    slot.got += chunk.length;
}

function onGetEnd() {
    const slot = this.slot;
    if (slot.stream !== this) return;
    slot.done = true;
    const now = performance.now();
    if (slot.status !== 200) errors.status++;
    else if (slot.bad || (expectBytes !== undefined && slot.got !== expectBytes)
        || (content && expectBytes === undefined && slot.got !== content.length)) errors.parse++;
    else record(now, slot.sentAt);
}

function onStreamError(e) {
    lastError = e;   // counted when the stream closes
}

function onGetClose() {
    const slot = this.slot;
    if (slot.stream !== this) return;
    slot.stream = null;
    const { conn } = slot;
    if (!live(conn, slot.session)) return;   // the session's own failure is counted once, by the session
    if (!slot.done) errors.read++;           // reset by the server, or ended without its answer
    const now = performance.now();
    if (running(now)) issue(slot, now);
}

// ---- grpc-bidi: m calls per session, one message in flight on each ---------------------------------

function newCall(conn, index) {
    const frame = Buffer.alloc(5 + size);
    frame.writeUInt32BE(size, 1);   // flag 0 (not compressed), then the length
    const id = conn.index * streams + index;
    // Bytes 0-3: the sequence number (send() writes it); 4-7: the call; then a pattern of the call.
    for (let i = 4; i < size; i++) frame[5 + i] = i < 8 ? (id >>> (8 * (i - 4))) & 0xff : (id * 7 + i) & 0xff;
    const call = {
        conn, frame, id, seq: 0, stream: null, session: null, sentAt: 0, echoed: 0, inFlight: false,
        ready: false, failed: false, ending: false, ok: false, ended: false, settled: null,
    };
    call.onWrite = (e) => {
        if (e && call.stream && !call.failed && live(conn, call.session)) {
            lastError = e;
            call.failed = true;
            errors.write++;
        }
    };
    return call;
}

function startCall(call, now) {
    const session = call.conn.session;
    let stream;
    try {
        stream = session.request(GRPC_HEADERS, { endStream: false });
    } catch (e) {
        lastError = e;
        return;
    }
    stream.call = call;
    call.stream = stream;
    call.session = session;
    call.inFlight = call.ready = call.failed = call.ending = call.ok = call.ended = false;
    stream.on('response', onCallResponse);
    stream.on('data', onCallData);
    stream.on('trailers', onCallTrailers);
    stream.on('end', onCallEnd);
    stream.on('error', onStreamError);
    stream.on('close', onCallClose);
    send(call, now);
}

function send(call, now) {
    const { frame } = call;
    const seq = ++call.seq;
    for (let i = 0; i < 4 && i < size; i++) frame[5 + i] = (seq >>> (8 * i)) & 0xff;   // each message its own bytes
    call.echoed = 0;
    call.inFlight = true;
    call.sentAt = now;
    call.stream.write(frame, call.onWrite);
}

// Fails the call with one error; it is reset, and started again (a new stream) when it closes.
function failCall(call, stream, counter) {
    if (!call.failed) {
        call.failed = true;
        errors[counter]++;
    }
    if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
}

function onCallResponse(headers) {
    const call = this.call;
    if (call.stream !== this) return;
    // A trailers-only answer (an unknown method: grpc-status 12) carries grpc-status in the headers.
    const grpcStatus = headers['grpc-status'];
    if (headers[':status'] !== 200 || (grpcStatus !== undefined && grpcStatus !== '0')) failCall(call, this, 'status');
    else if (grpcStatus === '0') call.ok = true;
}

function onCallData(chunk) {
    const call = this.call;
    if (call.stream !== this || call.failed) return;
    const now = performance.now();
    if (now >= windowStart && now < windowEnd) bytesIn += chunk.length;
    const end = call.echoed + chunk.length;
    if (!call.inFlight || end > call.frame.length || chunk.compare(call.frame, call.echoed, end) !== 0) {
        failCall(call, this, 'parse');
        return;
    }
    call.echoed = end;
    if (end < call.frame.length) return;
    call.inFlight = false;   // the whole echo is back
    if (!call.ready) {
        call.ready = true;   // its response headers came with it
        call.settled?.(true);
    }
    record(now, call.sentAt);
    if (running(now) && !call.ending) send(call, now);
}

function onCallTrailers(trailers) {
    const call = this.call;
    if (call.stream !== this) return;
    if (trailers['grpc-status'] === '0') call.ok = true;
    else failCall(call, this, 'status');
}

function onCallEnd() {
    if (this.call.stream === this) this.call.ended = true;
}

function onCallClose() {
    const call = this.call;
    if (call.stream !== this) return;
    call.stream = null;
    const { conn } = call;
    if (phase === 'stop') {   // our end of the stream answered: the last echo, if any, then grpc-status 0
        if (call.ending && !call.failed && !(call.ok && call.ended && !call.inFlight)) errors.close++;
        return;
    }
    if (!live(conn, call.session)) {
        call.settled?.(false);
        return;
    }
    if (!call.failed) {
        if (call.ended) errors.closed++;   // the server ended the call before the client did
        else errors.read++;                // reset by the server
    }
    call.settled?.(false);
    const now = performance.now();
    if (phase === 'run' && running(now)) startCall(call, now);
}

// ---- the run -----------------------------------------------------------------------------------

// Set-up of a connected session: nothing more for get; in grpc-bidi its calls, each with its first echo.
function setUp(conn, settled) {
    if (!grpc) {
        settled(true);
        return;
    }
    conn.slots ??= Array.from({ length: streams }, (_, i) => newCall(conn, i));
    let pending = streams;
    for (const call of conn.slots) {
        call.settled = () => {
            call.settled = null;
            if (--pending === 0) settled(true);
        };
        startCall(call, performance.now());
    }
}

// The window's work on a ready session: at the window's start, or when a connection was opened again.
function startWork(conn, now) {
    if (grpc) {
        conn.slots ??= Array.from({ length: streams }, (_, i) => newCall(conn, i));
        for (const call of conn.slots) {
            call.settled = null;
            if (call.stream && call.session === conn.session) {
                if (call.ready && !call.inFlight && !call.failed) send(call, now);
            } else {
                startCall(call, now);
            }
        }
    } else {
        conn.slots ??= Array.from({ length: streams }, () => ({ conn, stream: null }));
        for (const slot of conn.slots) issue(slot, now);
    }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
    const limit = SETUP_MS + duration * 1000 + DRAIN_MS + 5000;
    const hardLimit = setTimeout(() => die(`hard timeout: not finished after ${limit} ms`, 3), limit);
    hardLimit.unref();

    // Set-up, before the clock.
    await Promise.race([
        Promise.all(conns.map((conn) => new Promise((resolve) => {
            let done = false;
            openSession(conn, (ok) => {
                if (!done) resolve(ok);
                done = true;
            });
        }))),
        sleep(SETUP_MS),
    ]);
    for (const conn of conns) {   // still connecting: counted, and opened again when the window starts
        if (conn.ready || !conn.session) continue;
        errors.connect++;
        lastError ??= new Error(`no session within ${SETUP_MS} ms`);
        const session = conn.session;
        conn.session = null;
        session.destroy();
    }
    if (!conns.some((c) => c.ready)) die(`could not connect to ${origin.origin}: ${lastError.message}`);

    // The window.
    phase = 'run';
    windowStart = performance.now();
    windowEnd = windowStart + duration * 1000;
    for (const conn of conns) {
        if (conn.ready) startWork(conn, windowStart);
        else if (!conn.session) openSession(conn);
    }
    await sleep(windowEnd - performance.now());
    while (performance.now() < windowEnd) await sleep(1);

    // The drain: in-flight answers finish, uncounted; each call ends its stream and waits for grpc-status 0.
    phase = 'stop';
    const end = performance.now();
    const work = conns.flatMap((c) => (c.slots && c.ready && !c.broken ? c.slots : []));
    for (const w of work) {
        if (!w.stream || w.session !== w.conn.session) continue;
        if ((grpc ? w.inFlight : !w.done) && end - w.sentAt > TIMEOUT_MS) errors.timeout++;
        if (grpc && !w.failed) {
            w.ending = true;
            w.stream.end();
        }
    }
    const drainEnd = end + DRAIN_MS;
    while (work.some((w) => w.stream) && performance.now() < drainEnd) await sleep(5);
    for (const w of work) {
        if (!w.stream) continue;
        if (grpc && w.ending && !w.failed) errors.close++;   // our end of the stream not answered in time
        w.stream.close(http2.constants.NGHTTP2_CANCEL);
    }
    for (const conn of conns) conn.session?.destroy();

    // JSON with wsload's spacing: {"key": value, ...}.
    const fields = (o) => `{${Object.entries(o)
        .map(([k, v]) => `"${k}": ${typeof v === 'object' ? fields(v) : JSON.stringify(v)}`).join(', ')}}`;
    const result = {
        requests, duration_us: Math.round(duration * 1e6), bytes: bytesIn, connections, streams, mode,
        ...(grpc ? { message_bytes: size } : {}),
        errors,
        latency_us: {
            p50: percentile(50), p90: percentile(90), p99: percentile(99), max: latMax,
            mean: latTotal ? Math.round((latSum / latTotal) * 10) / 10 : 0,
        },
    };
    process.stdout.write(`${fields(result)}\n`, () => process.exit(0));
}

main().catch((e) => die(e.stack ?? String(e)));
