#!/usr/bin/env bash
# Measures `belfry task export` (the paged listing of a queue's live tasks) against
# `belfry task import` of the same tasks, in the same run, on a fresh embedded-store server:
#   1. import N tasks (200-byte payloads, due over the next 30 days): the baseline;
#   2. export them while their buckets are as the import left them;
#   3. kill -9 and restart the server (every far bucket unloaded), export again.
# Prints the wall times, tasks/s, the export's rate ÷ the import's and the server's RSS (after
# the step, and its peak during the step) at each step, as a Markdown table row per step.
#
# Usage: scripts/bench-export.sh [TASKS] [BELFRY_BIN]   (defaults: 1000000, target/release/belfry)
set -euo pipefail

tasks=${1:-1000000}
bin=${2:-target/release/belfry}
port=${BENCH_EXPORT_PORT:-17391}
work=$(mktemp -d /tmp/bench-export.XXXXXX)
url="http://127.0.0.1:$port"
server_pid=""

cleanup() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

start_server() {
    "$bin" serve --data-dir "$work/data" --listen "127.0.0.1:$port" >>"$work/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 200); do
        if curl -sf "$url/readyz" >/dev/null 2>&1; then return 0; fi
        sleep 0.05
    done
    echo "server did not start; log:" >&2
    cat "$work/server.log" >&2
    exit 1
}

rss() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$server_pid/status"; }
peak() { awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$server_pid/status"; }
now_ns() { date +%s%N; }
# Resets the peak RSS (VmHWM) so that the next `peak` is the export's own, not the import's
# or a restart's WAL replay's.
reset_peak() { echo 5 >"/proc/$server_pid/clear_refs" 2>/dev/null || true; }

echo "generating $tasks tasks" >&2
python3 - "$tasks" >"$work/tasks.ndjson" <<'EOF'
import json, sys
n = int(sys.argv[1])
pad = "x" * 180
for i in range(n):
    # Due over 30 days: minute, hour and day buckets alike.
    delay = 60_000 + (i * 2_592_000_000) // n
    print(json.dumps({"payload": {"n": i, "pad": pad}, "delay_ms": delay,
                      "idempotency_key": f"k{i}"}, separators=(",", ":")))
EOF

start_server
"$bin" queue create bench --server "$url" >/dev/null
rss_start=$(rss)

t0=$(now_ns)
"$bin" task import bench "$work/tasks.ndjson" --server "$url" >/dev/null
t1=$(now_ns)
import_s=$(echo "($t1 - $t0) / 1000000000" | bc -l)
rss_import=$(rss)

reset_peak
t0=$(now_ns)
"$bin" task export bench "$work/export-1.ndjson" --server "$url" 2>/dev/null
t1=$(now_ns)
export1_s=$(echo "($t1 - $t0) / 1000000000" | bc -l)
rss_export1=$(rss)
peak_export1=$(peak)
lines1=$(wc -l <"$work/export-1.ndjson")

kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null || true
start_server
rss_restart=$(rss)
reset_peak
t0=$(now_ns)
"$bin" task export bench "$work/export-2.ndjson" --server "$url" 2>/dev/null
t1=$(now_ns)
export2_s=$(echo "($t1 - $t0) / 1000000000" | bc -l)
rss_export2=$(rss)
peak_export2=$(peak)
lines2=$(wc -l <"$work/export-2.ndjson")

if [[ $lines1 -ne $tasks || $lines2 -ne $tasks ]]; then
    echo "exported $lines1 and $lines2 lines, expected $tasks" >&2
    exit 1
fi

rate() { echo "$tasks / $1" | bc -l | xargs printf "%.0f"; }
echo "| step | seconds | tasks/s | rate ÷ import's | server RSS after (peak during), MiB |"
echo "| --- | --- | --- | --- | --- |"
printf "| import (baseline) | %.2f | %s | 1.00× | %s (from %s) |\n" \
    "$import_s" "$(rate "$import_s")" "$rss_import" "$rss_start"
printf "| export, buckets as the import left them | %.2f | %s | %.2f× | %s (%s) |\n" \
    "$export1_s" "$(rate "$export1_s")" "$(echo "$import_s / $export1_s" | bc -l)" \
    "$rss_export1" "$peak_export1"
printf "| export after kill -9 and restart (far buckets unloaded) | %.2f | %s | %.2f× | %s (%s; %s after the restart) |\n" \
    "$export2_s" "$(rate "$export2_s")" "$(echo "$import_s / $export2_s" | bc -l)" \
    "$rss_export2" "$peak_export2" "$rss_restart"
