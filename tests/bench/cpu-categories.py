#!/usr/bin/env python3
"""Where a proxied request's user-space instructions go, by category.

Usage: cpu-categories.py CALLGRIND_OUT REQUESTS [-v]

Reads a callgrind profile of the proxy made under the bench (see docs/benchmark.md,
"Where a request's CPU goes": tests/bench/callgrind-wrap.sh, then SIGTERM) and prints
callgrind's exclusive (self) costs grouped into the categories of that table, by the
source file (crate) each cost is attributed to, or by the function for standard
library code inlined into it, divided by REQUESTS (`switchback_requests_total`, which
the bench prints). Startup-only work (entropy, certificates, config) is left out;
`-v` lists what fell into no category."""
import re, subprocess, sys
out_file, requests = sys.argv[1], int(sys.argv[2])
text = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", out_file],
                      capture_output=True, text=True).stdout
rows = []
for line in text.splitlines():
    m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+:\S.*)$", line)
    if m and "PROGRAM TOTALS" not in line:
        rows.append((int(m.group(1).replace(",", "")), m.group(2)))
STARTUP = r"jitter|jent_|aws-lc|rustls|pem|crds/src|config/prepare|sources/|serde_yaml|unsafe_libyaml|clap|ld-linux|dl-|_dl_|notify-\d|inotify|regex|schemars|revision|x509|webpki|/ring-|/url-|idna|sha2|keccak|certs"
CATS = [
    ("memory copies (memcpy/memmove: futures and buffers moved)", r"memmove|memcpy|memset"),
    ("allocation (mimalloc, Vec growth)", r"mimalloc|/alloc\.rs|raw_vec|__rust_(alloc|dealloc|realloc)|_int_malloc|malloc|free\b"),
    ("header maps (http::HeaderMap, names, values)", r"http-1\.\d+\.\d+/src/header/"),
    ("HTTP/1 parsing and encoding (httparse, hyper role/decode/encode)", r"httparse|hyper-1\.\d+\.\d+/src/proto/h1/(role|decode|encode)\.rs|http-1\.\d+\.\d+/src/(uri|method|status|version)"),
    ("JSON and SSE reading (body peek, answer check, usage, event framing)", r"serde_json|serde_core|serde-|wire/json\.rs|wire/usage\.rs|http/route\.rs:.*peek|wire/sse\.rs|wire/content\.rs"),
    ("model rewrite and event searches (memchr: model, usage, error)", r"wire/rewrite\.rs|memchr"),
    ("request log line", r"request_lines|request_line|itoa|core/src/fmt|alloc/src/fmt|telemetry/writer"),
    ("tracing (dispatch, spans)", r"tracing-core|tracing-subscriber|tracing-0\.|tracing/src"),
    ("metrics (counters, GenAI, cost)", r"observe/|prometheus|admin/metrics"),
    ("upstream pool (hyper-util client)", r"hyper-util-[\d.]+/src/client|hash/sip|hashbrown|hash/mod\.rs|BuildHasher"),
    ("tasks and wake-ups (tokio scheduler, channels, timers)", r"tokio-[\d.]+/src/(runtime/(scheduler|task|context|time|park)|sync|time|util|loom)|futures-(util|core|channel)|want-|atomic-waker|parking|std/src/(sync|thread)"),
    ("socket I/O (tokio, hyper io, syscall wrappers)", r"tokio-[\d.]+/src/(net|io|runtime/io)|hyper-1\.\d+\.\d+/src/proto/h1/io\.rs|hyper-util-[\d.]+/src/(rt|common)|libc\.so|sysdeps/unix|writev|recv|epoll|mio-"),
    ("hyper connection state machines (server and client dispatch)", r"hyper-1\.\d+\.\d+/src/|hyper-util-[\d.]+/src/server|http-body|bytes-"),
    ("routing (axum, tower)", r"axum|tower"),
    ("the proxy's own request path (auth, route, walk, attempt, relay, stamp)", r"switchback|proxy/src"),
]
FUNCS = {
    "allocation (mimalloc, Vec growth)": r"RawVec|finish_grow|alloc::alloc",
    "header maps (http::HeaderMap, names, values)": r"http::header",
    "HTTP/1 parsing and encoding (httparse, hyper role/decode/encode)": r"httparse|h1::role|h1::decode|h1::encode|http::uri|core::str::converts::from_utf8",
    "request log line": r"request_lines|request_line|core::fmt",
    "tracing (dispatch, spans)": r"^tracing",
    "upstream pool (hyper-util client)": r"hyper_util::client|sip::Hasher|hash_one",
    "tasks and wake-ups (tokio scheduler, channels, timers)": r"tokio::runtime::(scheduler|task|context|time)|tokio::sync|VecDeque|Iter<T>",
    "socket I/O (tokio, hyper io, syscall wrappers)": r"tokio::runtime::io|tokio::net|h1::io::",
    "hyper connection state machines (server and client dispatch)": r"hyper::",
    "the proxy's own request path (auth, route, walk, attempt, relay, stamp)": r"switchback",
}
totals, startup, other = {}, 0, {}
for cost, name in rows:
    if re.search(STARTUP, name):
        startup += cost
        continue
    file, _, func = name.partition(":")
    # Code of the standard library inlined into a function: classed by that function.
    key = func if "/rustc/" in file or "/library/" in file else name
    for cat, pat in CATS:
        if re.search(pat, key) or re.search(FUNCS.get(cat, "^$"), key):
            totals[cat] = totals.get(cat, 0) + cost
            break
    else:
        other[name] = other.get(name, 0) + cost
rest = sum(other.values())
all_ = sum(totals.values()) + rest
print(f"requests {requests}; per request, user-space instructions (startup work left out: {startup/requests:,.0f} per request-equivalent)")
for cat, _ in CATS:
    v = totals.get(cat, 0)
    print(f"{v/requests:9,.0f}  {100*v/all_:5.1f} %  {cat}")
print(f"{rest/requests:9,.0f}  {100*rest/all_:5.1f} %  other")
print(f"{all_/requests:9,.0f}  100.0 %  total")
if "-v" in sys.argv:
    for n, c in sorted(other.items(), key=lambda x: -x[1])[:25]:
        print(f"   other {c/requests:8,.0f} {n[:150]}")
