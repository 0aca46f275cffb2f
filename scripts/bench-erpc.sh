#!/usr/bin/env bash
# eRPC (UDP loopback) vs tarpc (TCP loopback): echo throughput/latency at QD 1, 8, 32 and
# large-message goodput, each configuration run REPEAT times (examples/erpc_bench.rs, release).
#
# Usage: scripts/bench-erpc.sh [repeat] [seconds]   (defaults 2 runs, 2 s per point)
# CSVs go to target/erpc-bench/{echo,large}-N.csv; the human summaries, with the load average
# before and after each run, to stderr. Benchmarks on a shared 2-core machine are noisy:
# compare runs, and rerun when the load average is high.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-2}
secs=${2:-2}
out=target/erpc-bench
mkdir -p "$out"
cargo build -q --release --example erpc_bench
bin=target/release/examples/erpc_bench
for i in $(seq 1 "$repeat"); do
  echo "== run $i/$repeat: echo (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  "$bin" echo --qd 1,8,32 --duration "$secs" --csv "$out/echo-$i.csv"
  echo "== run $i/$repeat: large (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  "$bin" large --duration "$secs" --csv "$out/large-$i.csv"
done
echo "CSVs in $out/" >&2
