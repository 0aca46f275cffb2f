#!/usr/bin/env bash
# Instructions per call of a 32 B `&[u8]` argument against the same call with a `[u8; 32]`
# argument (issue 15 §3): delegation ring (default) or copyrpc on the device model, queue depth
# 1, zero-copy server path, one thread in lock step (examples/varlen_lockstep.rs, release
# build, callgrind).
#
# Usage: scripts/callgrind-varlen.sh [calls] [delegation|copyrpc]   (default 100000 delegation;
#        needs valgrind)
#        CG_KEEP=dir scripts/callgrind-varlen.sh ...  keeps the profiles (callgrind_annotate them)
#
# Collection is toggled on inside the three #[inline(never)] steps of each variant
# (`client_issue_*`, `server_serve_*`, `client_complete_*`), so each step's inclusive arc cost
# is its path alone; on copyrpc it is also toggled off inside the model's doorbell entry point
# ('<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq', as scripts/callgrind-copyrpc.sh),
# so the figures exclude the model. Counts are divided by the calls (the steps of the copyrpc
# run include the empty server round and client poll that send the request). Target:
# slice/array <= 1.10.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/callgrind.sh
source scripts/lib/callgrind.sh
n=${1:-100000}
transport=${2:-delegation}
ex=varlen_lockstep
bin=target/release/examples/$ex

cargo build -q --release --example "$ex"
if [[ -n ${CG_KEEP:-} ]]; then
  dir=$CG_KEEP
  mkdir -p "$dir"
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
extra=()
case $transport in
  delegation) ;;
  copyrpc) extra=(--toggle-collect='<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq') ;;
  *) echo "unknown transport '$transport' (delegation|copyrpc)" >&2; exit 2 ;;
esac
declare -A issue serve complete
for v in slice array; do
  valgrind --tool=callgrind --callgrind-out-file="$dir/$v.callgrind" --collect-atstart=no \
    --toggle-collect="$ex::client_issue_$v" --toggle-collect="$ex::server_serve_$v" \
    --toggle-collect="$ex::client_complete_$v" "${extra[@]}" \
    "$bin" "$v" "$n" "$transport" >"$dir/$v.stdout" 2>"$dir/$v.log" || {
    cat "$dir/$v.log" >&2
    exit 1
  }
  grep -q "calls verified" "$dir/$v.stdout" || {
    cat "$dir/$v.stdout" >&2
    exit 1
  }
  arcs=$(cg_arcs "$dir/$v.callgrind")
  issue[$v]=$(cg_field "$arcs" "$ex::client_issue_$v" 2)
  serve[$v]=$(cg_field "$arcs" "$ex::server_serve_$v" 2)
  complete[$v]=$(cg_field "$arcs" "$ex::client_complete_$v" 2)
  calls=$(cg_field "$arcs" "$ex::client_issue_$v" 3)
  ((calls == n)) || { echo "$v: $calls calls of client_issue_$v, expected $n (inlined?)" >&2; exit 1; }
  total=$(cg_summary "$dir/$v.callgrind")
  sum=$((issue[$v] + serve[$v] + complete[$v]))
  ((sum == total)) || { echo "$v: split mismatch: $sum != $total" >&2; exit 1; }
done
echo "transport $transport, 32 B argument, QD 1"
awk -v n="$n" \
  -v si="${issue[slice]}" -v ss="${serve[slice]}" -v sc="${complete[slice]}" \
  -v ai="${issue[array]}" -v as="${serve[array]}" -v ac="${complete[array]}" 'BEGIN {
  print "variant,calls,client_issue,server_serve,client_complete,total_per_call"
  printf "slice,%d,%.1f,%.1f,%.1f,%.1f\n", n, si / n, ss / n, sc / n, (si + ss + sc) / n
  printf "array,%d,%.1f,%.1f,%.1f,%.1f\n", n, ai / n, as / n, ac / n, (ai + as + ac) / n
  printf "ratio slice/array: total %.4f, issue %.4f, serve %.4f, complete %.4f\n",
    (si + ss + sc) / (ai + as + ac), si / ai, ss / as, sc / ac
}'
