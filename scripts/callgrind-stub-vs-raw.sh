#!/usr/bin/env bash
# Instructions per call, generated stub vs hand-written raw ring call (client side only).
# Usage: scripts/callgrind-stub-vs-raw.sh [calls]   (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
cargo build -q --release --example stub_vs_raw
declare -A ir
for v in stub raw; do
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" --collect-atstart=no \
    --toggle-collect='stub_vs_raw::client_*' target/release/examples/stub_vs_raw "$v" "$n" >/dev/null 2>&1
  ir[$v]=$(awk '/^(summary|totals):/ {print $2; exit}' "$out")
  rm -f "$out"
done
awk -v s="${ir[stub]}" -v r="${ir[raw]}" -v n="$n" 'BEGIN {
  printf "variant,calls,instructions,instructions_per_call\n";
  printf "stub,%d,%d,%.2f\nraw,%d,%d,%.2f\n", n, s, s/n, n, r, r/n;
  printf "ratio stub/raw = %.4f\n", s/r }'
