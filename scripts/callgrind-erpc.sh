#!/usr/bin/env bash
# Instructions per eRPC RPC (32 B echo, or `size` bytes) on the client path and on the server path, excluding
# the device model (examples/erpc_lockstep.rs over mlx5 UD on the model, release build,
# callgrind).
#
# Usage: scripts/callgrind-erpc.sh [rpcs] [qd] [cc] [size]   (defaults 100000, 1, on, 32 B;
#        needs valgrind)
#        CG_TREE=depth scripts/... also prints each function's instructions per RPC as a tree
#          of inlined frames (scripts/lib/cg_inline.py; CG_TREE_ROOTS="fn;fn..." adds roots,
#          full symbol names as callgrind prints them, e.g. out-of-line callees, whose own
#          trees are then printed too; CG_TREE_MIN hides entries below it, default 1)
#        CG_STEPS=1 scripts/... also prints each side's instructions per RPC by source file
#          (protocol step) and function (scripts/lib/cg_steps.py, a third profile with
#          --separate-callers; CG_STEPS_MIN hides entries below it, default 1)
#        CG_KEEP=dir scripts/callgrind-erpc.sh ...      keeps the profiles
#
# The lock-step driver runs client and server endpoints in one thread: each round the client
# enqueues `qd` requests (`client_issue`), runs one loop iteration that sends them
# (`client_poll`), the server runs one zero-copy iteration answering them in place
# (`server_serve`), and the client runs one zero-copy iteration receiving the responses
# (`client_poll`). All three are #[inline(never)].
# Pass 1 toggles collection on in those three functions and off inside the model's doorbell
# entry point ('<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq', only reached from
# them), so each function's inclusive arc cost is its path without the model. Pass 2 toggles
# only the three functions: the difference is the model. Counts are divided by every RPC run.
# The client and server figures include reading the clock (vDSO clock_gettime) each iteration.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/callgrind.sh
source scripts/lib/callgrind.sh
n=${1:-100000}
qd=${2:-1}
cc=${3:-on}
size=${4:-32}
ex=erpc_lockstep
bin=target/release/examples/$ex
model_fn='<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq'
fns=("$ex::client_issue" "$ex::client_poll" "$ex::server_serve")

cargo build -q --release --example "$ex"
if [[ -n ${CG_KEEP:-} ]]; then
  dir=$CG_KEEP
  mkdir -p "$dir"
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
toggles=()
for f in "${fns[@]}"; do toggles+=(--toggle-collect="$f"); done

run() { # name, extra options...
  local name=$1
  shift
  valgrind --tool=callgrind --callgrind-out-file="$dir/$name.callgrind" --collect-atstart=no \
    "$@" "$bin" "$n" --qd "$qd" --cc "$cc" --size "$size" >"$dir/$name.stdout" 2>"$dir/$name.log" || {
    cat "$dir/$name.log" >&2
    exit 1
  }
  grep -q "rpcs verified" "$dir/$name.stdout" || {
    cat "$dir/$name.stdout" >&2
    exit 1
  }
}
tree=()
[[ -n ${CG_TREE:-} ]] && tree=(--dump-instr=yes)
run nomodel "${toggles[@]}" --toggle-collect="$model_fn" "${tree[@]}"
run all "${toggles[@]}"

a1=$(cg_arcs "$dir/nomodel.callgrind")
total_nomodel=$(cg_summary "$dir/nomodel.callgrind")
total_all=$(cg_summary "$dir/all.callgrind")
issue=$(cg_field "$a1" "${fns[0]}" 2)
cpoll=$(cg_field "$a1" "${fns[1]}" 2)
serve=$(cg_field "$a1" "${fns[2]}" 2)
rpcs=$(awk -F, 'NR == 3 {print $4}' "$dir/nomodel.stdout")
((issue + cpoll + serve == total_nomodel)) || {
  echo "split mismatch: $issue + $cpoll + $serve != $total_nomodel" >&2
  exit 1
}
model=$((total_all - total_nomodel))
((model > 0)) || { echo "no model cost: '$model_fn' renamed or inlined?" >&2; exit 1; }
echo "# $(sed -n 2,3p "$dir/nomodel.stdout" | paste -sd' ' | tr ',' ' ')" >&2
awk -v r="$rpcs" -v qd="$qd" -v cc="$cc" -v i="$issue" -v p="$cpoll" -v s="$serve" -v m="$model" 'BEGIN {
  print "qd,cc,rpcs,component,instructions_per_rpc"
  printf "%d,%s,%d,client (issue + poll),%.1f\n", qd, cc, r, (i + p) / r
  printf "%d,%s,%d,client.issue,%.1f\n", qd, cc, r, i / r
  printf "%d,%s,%d,client.poll,%.1f\n", qd, cc, r, p / r
  printf "%d,%s,%d,server (rx + reply_zc + tx),%.1f\n", qd, cc, r, s / r
  printf "%d,%s,%d,model (both directions),%.1f\n", qd, cc, r, m / r
}'
if [[ -n ${CG_TREE:-} ]]; then
  IFS=';' read -ra roots <<<"${CG_TREE_ROOTS:-}"
  python3 scripts/lib/cg_inline.py "$dir/nomodel.callgrind" "$bin" "$rpcs" "${fns[@]}" "${roots[@]}" \
    --depth "$CG_TREE" --min "${CG_TREE_MIN:-1}"
fi
if [[ -n ${CG_STEPS:-} ]]; then
  run steps "${toggles[@]}" --toggle-collect="$model_fn" --dump-instr=yes --separate-callers=8
  python3 scripts/lib/cg_steps.py "$dir/steps.callgrind" "$bin" "$rpcs" . \
    "client=${fns[0]},${fns[1]}" "server=${fns[2]}" --min "${CG_STEPS_MIN:-1}"
fi
