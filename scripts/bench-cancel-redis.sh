#!/usr/bin/env bash
# A/B: cancel 5,000 tasks (5 requests of 1,000) through `belfry task cancel --ids-file` on a
# Redis-backed server, for the binary $1. Prints milliseconds. Needs `redis-server` on PATH
# (scripts/redis-install.sh installs one) and curl; starts and stops its own Redis on port 17601
# and server on 17602.
set -euo pipefail
bin=$1
dir=$(mktemp -d /tmp/cab.XXXX)
redis-server --port 17601 --save '' --appendonly no --dir "$dir" >/dev/null 2>&1 &
rpid=$!
spid=""
trap 'kill $spid $rpid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
sleep 0.5
"$bin" serve --store redis://127.0.0.1:17601 --listen 127.0.0.1:17602 >"$dir/log" 2>&1 &
spid=$!
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:17602/readyz >/dev/null && break; sleep 0.1; done
url=http://127.0.0.1:17602
"$bin" queue create q --server $url >/dev/null
python3 -c '
import json
print(json.dumps({"tasks": [{"payload": i, "delay_ms": 3600000} for i in range(1000)]}))' >"$dir/batch.json"
: >"$dir/ids"
for _ in 1 2 3 4 5; do
  curl -s -X POST $url/v1/queues/q/tasks:batch -H 'content-type: application/json' --data-binary @"$dir/batch.json" \
    | python3 -c 'import json,sys; [print(r["id"]) for r in json.load(sys.stdin)["results"]]' >>"$dir/ids"
done
t0=$(date +%s%N)
"$bin" task cancel q --ids-file "$dir/ids" --server $url
t1=$(date +%s%N)
echo "$(( (t1 - t0) / 1000000 )) ms for $(wc -l <"$dir/ids") ids"
