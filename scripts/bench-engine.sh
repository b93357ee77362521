#!/usr/bin/env bash
# The storage-engine benchmark, as recorded in BENCHMARKS.md (engine section):
#   1. raw fsync'd append vs the belfry engine vs fjall on 1M tasks, each run 3 times round-robin
#      (the median is shown): ingest, drain, write amplification, disk, reopen, RSS;
#   2. far-future pending tasks at 1M and 10M (RSS, disk per task, reopen after an unclean exit).
# Takes a few minutes on 2 cores. Extra arguments go to both runs (e.g. --dir /mnt/fast).
#
#   scripts/bench-engine.sh            # run and rewrite the engine section of BENCHMARKS.md
#   NO_MARKDOWN=1 scripts/bench-engine.sh   # only print
set -euo pipefail
cd "$(dirname "$0")/.."

markdown=(--write-markdown BENCHMARKS.md)
[ "${NO_MARKDOWN:-}" = 1 ] && markdown=()

cargo build --release -p belfry-store-bench
bench=target/release/belfry-store-bench
[ -n "${CARGO_TARGET_DIR:-}" ] && bench="$CARGO_TARGET_DIR/release/belfry-store-bench"

"$bench" --tasks 1000000 --repeat 3 "${markdown[@]}" "$@"
"$bench" pending --pending 10000000 --spread-days 730 "${markdown[@]}" "$@"
