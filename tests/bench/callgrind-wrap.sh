#!/bin/sh
# BENCH_PROXY_WRAPPER for instruction counts: runs the proxy ($CG_BIN if set, else
# the bench's) under callgrind as a child, so that the bench's SIGKILL of this
# script leaves the proxy running; the caller then sends it SIGTERM (pid in
# $CG_OUT.pid) and callgrind writes $CG_OUT as the proxy exits.
bin="$1"; shift
[ -n "$CG_BIN" ] && bin="$CG_BIN"
valgrind --tool=callgrind --callgrind-out-file="$CG_OUT" "$bin" "$@" &
echo $! > "$CG_OUT.pid"
wait
