#!/bin/sh
# callgrind-submits.sh - user-space instructions and allocations per single-task submit,
# counted by valgrind's callgrind on a whole `belfry serve`: a number that does not move with
# the machine's noise, for A/B of changes to the request path.
#
#   scripts/callgrind-submits.sh [BELFRY_BIN] [SUBMITS] [CONNECTIONS]
#
# Defaults: target/release/belfry, 10000 submits, 8 connections. Starts the server under
# callgrind with instrumentation off, warms it up with 2,000 submits, then counts only the
# measured submits (`callgrind_control -i on`, `-d`). Prints instructions and malloc calls per
# submit; the profile stays in $OUT (default ${TMPDIR:-/tmp}/belfry-callgrind) for
# `callgrind_annotate`. Needs valgrind (`apt-get install valgrind`).
set -eu

bin=${1:-target/release/belfry}
submits=${2:-10000}
connections=${3:-8}
out=${OUT:-${TMPDIR:-/tmp}/belfry-callgrind}

say() { printf 'callgrind-submits.sh: %s\n' "$*" >&2; }
command -v valgrind >/dev/null || { say "error: valgrind is not installed (apt-get install valgrind)"; exit 1; }
[ -x "$bin" ] || { say "error: $bin is not an executable (cargo build --release -p belfry)"; exit 1; }

rm -rf "$out"
mkdir -p "$out"
port=$((20000 + $$ % 20000))
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.out.%p" \
    "$bin" serve --listen "127.0.0.1:$port" --data-dir "$out/data" >"$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT

say "waiting for the server under callgrind (pid $server, port $port)"
tries=0
until curl -s -o /dev/null "http://127.0.0.1:$port/healthz"; do
    tries=$((tries + 1))
    [ "$tries" -lt 300 ] || { say "error: the server did not answer in 60 s; see $out/server.log"; exit 1; }
    sleep 0.2
done

ingest() {
    "$bin" bench ingest --url "http://127.0.0.1:$port" --queue callgrind --baseline none \
        --no-progress --connections "$connections" --tasks "$1" >/dev/null
}
say "warming up (2,000 submits)"
ingest 2000
callgrind_control -i on "$server" >/dev/null
say "counting $submits submits over $connections connections"
ingest "$submits"
callgrind_control -d "$server" >/dev/null
callgrind_control -i off "$server" >/dev/null

profile=$(ls -S "$out"/callgrind.out.* | head -1)
instructions=$(callgrind_annotate "$profile" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
mallocs=$(callgrind_annotate --tree=caller "$profile" 2>/dev/null |
    sed -n 's/.*< .*__rdl_alloc (\([0-9,]*\)x).*/\1/p' | tr -d , | head -1)
echo "instructions per submit: $((instructions / submits))"
echo "allocations per submit: $((${mallocs:-0} / submits))"
echo "profile: $profile"
