#!/bin/sh
# profile.sh - where a belfry server's CPU goes under one `belfry bench` scenario: a CPU
# profile of the whole server process (perf, every thread, DWARF call stacks), a flame graph,
# and the CPU per request or task by stage (`belfry bench stages`).
#
#   scripts/profile.sh NAME UNITS [--] SCENARIO [BENCH ARGS...]
#   scripts/profile.sh --bench-threads COMM NAME UNITS [--] SCENARIO [BENCH ARGS...]
#
# The first form starts `belfry serve` on a free loopback port and a fresh data dir, runs
# `belfry bench SCENARIO --url … BENCH ARGS` against it while perf samples the server, and
# stops both. The second profiles the bench process itself and keeps only its threads named
# COMM: the in-process baselines (`baseline-http`, the trivial HTTP handler).
#
# UNITS is the work the run does (requests, tasks): the stage table divides by it. UNITS may
# instead be `metric:NAME`, a counter of the server's /metrics (summed over its labels): perf
# then starts once the counter moves, samples for DURATION seconds (default 6) while the bench
# goes on, and the counter's growth over that window is the units. This profiles one phase of
# a long scenario, such as the feed reads of `reminders` after its set-up.
# Writes $OUT/NAME.svg (frames under 0.25% of the CPU left out), $OUT/NAME.folded.gz (every
# sample: `zcat NAME.folded.gz | belfry bench stages - --units UNITS`) and $OUT/NAME.txt (the
# bench's report and the stage table). OUT defaults to docs/profiles.
#
# Environment: BELFRY_BIN (default target/release/belfry, built with debug info as the
# workspace's release profile is), OUT, FREQ (samples a second per CPU, default 499),
# SERVER_ENV (KEY=VALUE words added to the server's environment), START_AFTER (seconds into
# the bench before perf starts, to leave out a set-up phase such as the submits before a
# `fire` run's tasks fall due; default 0), DURATION (with metric:NAME units), TRACE_FSYNC (set: also trace the server's
# fdatasync calls and report their count and latency).
# Needs perf (Debian: linux-perf) and inferno (`cargo install inferno`).
set -eu

say() { printf 'profile.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

comm=
if [ "${1:-}" = --bench-threads ]; then
    [ $# -ge 2 ] || die "--bench-threads needs a thread name"
    comm=$2
    shift 2
fi
[ $# -ge 3 ] || die "usage: scripts/profile.sh [--bench-threads COMM] NAME UNITS [--] SCENARIO [BENCH ARGS...]"
name=$1
units=$2
shift 2
[ "${1:-}" = -- ] && shift
case $name in *[!A-Za-z0-9_-]*|'') die "NAME must be letters, digits, '-' and '_'" ;; esac
metric=
case $units in
    metric:?*) metric=${units#metric:} ;;
    *[!0-9]*|''|0) die "UNITS must be a whole number above 0, or metric:NAME" ;;
esac

bin=${BELFRY_BIN:-target/release/belfry}
out=${OUT:-docs/profiles}
freq=${FREQ:-499}
command -v perf >/dev/null || die "perf is not installed (apt-get install linux-perf)"
command -v inferno-collapse-perf >/dev/null && command -v inferno-flamegraph >/dev/null ||
    die "inferno is not installed (cargo install inferno)"
[ -x "$bin" ] || die "$bin is not an executable (cargo build --release -p belfry)"
mkdir -p "$out"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/belfry-profile.XXXXXX")
server=
perf_pid=
trace_pid=
cleanup() {
    for pid in $trace_pid $perf_pid $server; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

report="$out/$name.txt"
run="belfry bench $*"
record="perf record -q -e cpu-clock -F $freq --call-graph dwarf,16384 -o $tmp/perf.data"
if [ -z "$comm" ]; then
    port=$((20000 + $$ % 20000))
    # shellcheck disable=SC2086 # SERVER_ENV is a list of KEY=VALUE words
    env ${SERVER_ENV:-} "$bin" serve --listen "127.0.0.1:$port" --data-dir "$tmp/data" \
        >"$tmp/server.log" 2>&1 &
    server=$!
    tries=0
    until curl -s -o /dev/null "http://127.0.0.1:$port/healthz"; do
        tries=$((tries + 1))
        [ "$tries" -lt 100 ] || die "the server did not answer in 20 s; see its log: $(tail -5 "$tmp/server.log")"
        sleep 0.2
    done
    after=${START_AFTER:-0}
    say "server pid $server on port $port; perf samples it at $freq Hz from $after s into the bench to its end"
    start_perf() {
        $record -p "$server" >"$tmp/perf.log" 2>&1 &
        perf_pid=$!
        if [ -n "${TRACE_FSYNC:-}" ]; then
            perf record -e syscalls:sys_enter_fdatasync -e syscalls:sys_exit_fdatasync \
                -p "$server" -o "$tmp/fsync.data" >"$tmp/fsync.log" 2>&1 &
            trace_pid=$!
        fi
    }
    if [ "$after" = 0 ] && [ -z "$metric" ]; then
        start_perf
        sleep 1 # perf takes a moment to attach
    fi
    scenario=$1
    shift
    "$bin" bench "$scenario" --url "http://127.0.0.1:$port" --server-pid "$server" \
        --server-data-dir "$tmp/data" --no-progress "$@" >"$report" 2>&1 &
    bench=$!
    if [ -n "$metric" ]; then
        counter() {
            curl -s "http://127.0.0.1:$port/metrics" |
                awk -v m="$metric" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%d\n", s }'
        }
        while [ "$(counter)" = 0 ]; do
            kill -0 "$bench" 2>/dev/null || die "the bench ended before $metric moved: $(tail -5 "$report")"
            sleep 0.5
        done
        start_perf
        sleep 1 # perf takes a moment to attach
        cpu() { awk '{ print $14 + $15 }' "/proc/$server/stat"; }
        before=$(counter)
        cpu_before=$(cpu)
        sleep "${DURATION:-6}"
        units=$(($(counter) - before))
        cpu_ticks=$(($(cpu) - cpu_before))
        for pid in $trace_pid $perf_pid; do kill -INT "$pid"; done
        [ "$units" -gt 0 ] || die "$metric did not grow while perf sampled"
        say "$metric grew by $units while perf sampled"
        ticks_per_s=$(getconf CLK_TCK)
        cpu_line="server CPU over those ${DURATION:-6} s from /proc: $(awk -v t="$cpu_ticks" \
            -v hz="$ticks_per_s" -v u="$units" 'BEGIN { printf "%.2f µs a unit", t / hz * 1e6 / u }')"
    elif [ "$after" != 0 ]; then
        sleep "$after"
        start_perf
    fi
    wait "$bench" || die "the bench failed: $(tail -5 "$report")"
    if [ -z "$metric" ]; then
        for pid in $trace_pid $perf_pid; do kill -INT "$pid"; done
    fi
    for pid in $trace_pid $perf_pid; do wait "$pid" || true; done
    perf_pid=
    trace_pid=
    script_args=
else
    [ -z "$metric" ] || die "metric:NAME units need a server to read it from (not --bench-threads)"
    say "perf samples the bench at $freq Hz; keeping its threads named $comm"
    $record -- "$bin" bench "$@" --no-progress >"$report" 2>&1 ||
        die "the bench failed: $(tail -5 "$report")"
    script_args="--comms $comm"
fi

say "folding stacks (perf script takes a while)"
# shellcheck disable=SC2086 # script_args is empty or two words
perf script -i "$tmp/perf.data" $script_args 2>/dev/null | inferno-collapse-perf >"$tmp/folded"
[ -s "$tmp/folded" ] || die "perf recorded no samples (see $tmp/perf.log)"
gzip -9 -n -c "$tmp/folded" >"$out/$name.folded.gz"
inferno-flamegraph --minwidth 0.25 --hash --countname "µs of CPU" --factor 0.001 \
    --title "$name" --subtitle "$run" <"$tmp/folded" >"$out/$name.svg"
{
    echo
    echo "CPU by stage over $units units: zcat $out/$name.folded.gz | belfry bench stages - --units $units"
    "$bin" bench stages "$tmp/folded" --units "$units"
    [ -z "${cpu_line:-}" ] || echo "$cpu_line (perf's window is about a second longer than the count's)"
} >>"$report"
if [ -n "${TRACE_FSYNC:-}" ] && [ -z "$comm" ]; then
    # Each thread's fdatasync calls and how long each took, from the syscall tracepoints.
    perf script -i "$tmp/fsync.data" -F comm,tid,time,event 2>/dev/null | awk '
        { t = $3; sub(":", "", t) }
        /sys_enter_fdatasync/ { start[$2] = t; if (first == "") first = t; last = t; next }
        /sys_exit_fdatasync/ && ($2 in start) {
            us = (t - start[$2]) * 1e6
            print us >"'"$tmp/fsync.us"'"
            calls[$1]++; busy[$1] += us; delete start[$2]
        }
        END {
            for (c in calls)
                printf "  thread %s: %d calls, in fdatasync %.0f%% of the %.1f s traced\n",
                    c, calls[c], 100 * busy[c] / 1e6 / (last - first), last - first
        }' >"$tmp/fsync.threads"
    if [ -s "$tmp/fsync.us" ]; then
        sort -n "$tmp/fsync.us" | awk -v units="$units" '
            { d[NR] = $1; sum += $1 }
            END {
                printf "\nfdatasync calls traced: %d, %.1f units each\n", NR, units / NR
                printf "fdatasync latency: p10 %.0f µs, p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, mean %.0f µs\n",
                    d[int(NR * 0.1) + 1], d[int(NR * 0.5) + 1], d[int(NR * 0.9) + 1],
                    d[int(NR * 0.99) + 1], sum / NR
            }' >>"$report"
        cat "$tmp/fsync.threads" >>"$report"
    else
        printf '\nfdatasync: no calls traced\n' >>"$report"
    fi
fi
cat "$report"
say "wrote $out/$name.svg, $out/$name.folded.gz and $report"
