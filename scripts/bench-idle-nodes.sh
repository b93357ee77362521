#!/usr/bin/env bash
# bench-idle-nodes.sh - `belfry bench idle` against two belfry nodes sharing one Redis, with
# each node's CPU printed every 5 s, so that what one node's writes cost the other shows.
#
#   scripts/bench-idle-nodes.sh [--belfry-bin BIN] [-- BENCH-IDLE-OPTIONS...]
#
# Starts a throwaway Redis (scripts/redis.sh, port $REDIS_PORT, default 6395) and two nodes
# (`belfry serve --store redis://…`, node ids a and b, ports 7071 and 7072), runs
# `belfry bench idle --url <node a> --server-pid <node a>` with the options given (default:
# 100,000 reminders firing over the day's seconds, no schedules, 60 s idle after 30 s to
# settle), then stops exactly what it started. The bench creates through node a, so node a's
# row is the bench's table; node b's CPU is in the timeline.
#
# Example (the "Optimizations" rows of BENCHMARKS.md that name it):
#   cargo build --release -p belfry
#   scripts/bench-idle-nodes.sh -- --schedules 0 --reminders 100000 \
#       --reminder-times daily-seconds --idle-s 60 --settle-s 30
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/belfry
if [ "${1:-}" = --belfry-bin ]; then
    bin=$2
    shift 2
fi
if [ "${1:-}" = -- ]; then shift; fi
if [ $# -eq 0 ]; then
    set -- --schedules 0 --reminders 100000 --reminder-times daily-seconds --idle-s 60 --settle-s 30
fi
[ -x "$bin" ] || { echo "bench-idle-nodes.sh: no $bin (cargo build --release -p belfry)" >&2; exit 1; }

export REDIS_PORT=${REDIS_PORT:-6395}
scripts/redis.sh stop >/dev/null 2>&1 || true
scripts/redis.sh start >/dev/null
pids=()
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    scripts/redis.sh stop >/dev/null 2>&1 || true
}
trap stop EXIT

logs=$(mktemp -d)
for node in a:7071 b:7072; do
    "$bin" serve --store "redis://127.0.0.1:$REDIS_PORT" --listen "127.0.0.1:${node#*:}" \
        --node-id "${node%:*}" >"$logs/${node%:*}.log" 2>&1 &
    pids+=($!)
done
a=${pids[0]}
b=${pids[1]}
for _ in $(seq 100); do
    curl -sf http://127.0.0.1:7071/readyz >/dev/null && curl -sf http://127.0.0.1:7072/readyz >/dev/null && break
    sleep 0.2
done

# user + system CPU ticks (1/100 s) of a process
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
"$bin" bench idle --url http://127.0.0.1:7071 --server-pid "$a" --no-progress "$@" >"$logs/bench.txt" 2>&1 &
bench=$!
echo "node CPU every 5 s (a: the node the bench creates through and measures; b: the other):"
last_a=$(ticks "$a") last_b=$(ticks "$b") t=0
while kill -0 "$bench" 2>/dev/null; do
    sleep 5
    t=$((t + 5))
    now_a=$(ticks "$a") now_b=$(ticks "$b")
    printf 't=%ss a=%s%% b=%s%%\n' "$t" $(((now_a - last_a) * 100 / 500)) $(((now_b - last_b) * 100 / 500))
    last_a=$now_a last_b=$now_b
done
wait "$bench" || { cat "$logs/bench.txt"; exit 1; }
cat "$logs/bench.txt"
rm -rf "$logs"
