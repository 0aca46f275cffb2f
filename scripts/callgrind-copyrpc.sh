#!/usr/bin/env bash
# Instructions per copyrpc RPC on the client path and on the server path, excluding the device
# model (examples/copyrpc_bench.rs `lockstep`, release build, callgrind).
#
# Usage: scripts/callgrind-copyrpc.sh [rpcs] [qd] [copy|in-place]   (defaults 100000, 1, copy;
#        needs valgrind)
#        CG_TREE=depth scripts/... also prints each function's instructions per RPC as a tree
#          of inlined frames (scripts/lib/cg_inline.py; CG_TREE_ROOTS="fn;fn..." adds roots,
#          full symbol names as callgrind prints them, e.g. out-of-line callees, whose own
#          trees are then printed too; CG_TREE_MIN hides entries below it, default 1)
#        CG_STEPS=1 scripts/... also prints each side's instructions per RPC by source file
#          (protocol step) and function (scripts/lib/cg_steps.py, a third profile with
#          --separate-callers; CG_STEPS_MIN hides entries below it, default 1)
#        CG_KEEP=dir scripts/callgrind-copyrpc.sh ...  keeps the profiles
#
# The lock-step driver runs client and server in one thread: each round the client issues
# `qd` 32 B echo calls (`client_issue`), polls (`client_poll`: flushes them as one WRITE+IMM
# batch), the server polls, replies to each and flushes (`server_serve`), and the client polls
# the responses and checks them. All three are #[inline(never)]. The server replies with
# `recv` + a copy + `reply` (`copy`, the raw two-step API) or with `serve_next`, reading the
# request in place and writing the reply in the send ring (`in-place`, the typed server's path).
# Pass 1 toggles collection on in those three functions and off inside the model's doorbell
# entry point ('<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq', only reached from
# them), so each function's inclusive arc cost is its path without the model. Pass 2 toggles
# only the three functions: the difference is the model. Counts are divided by every RPC run
# (warm-up included: the same functions run it).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/callgrind.sh
source scripts/lib/callgrind.sh
n=${1:-100000}
qd=${2:-1}
mode=${3:-copy}
ex=copyrpc_bench
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
    "$@" "$bin" lockstep "$n" --qd "$qd" --serve "$mode" >"$dir/$name.stdout" 2>"$dir/$name.log" || {
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
issued=$(cg_field "$a1" "${fns[0]}" 3)
((issue + cpoll + serve == total_nomodel)) || {
  echo "split mismatch: $issue + $cpoll + $serve != $total_nomodel" >&2
  exit 1
}
model=$((total_all - total_nomodel))
((model > 0)) || { echo "no model cost: '$model_fn' renamed or inlined?" >&2; exit 1; }
awk -v r="$issued" -v qd="$qd" -v i="$issue" -v p="$cpoll" -v s="$serve" -v m="$model" 'BEGIN {
  print "qd,rpcs,component,instructions_per_rpc"
  printf "%d,%d,client (issue + poll)\t,%.1f\n", qd, r, (i + p) / r
  printf "%d,%d,client.issue,%.1f\n", qd, r, i / r
  printf "%d,%d,client.poll,%.1f\n", qd, r, p / r
  printf "%d,%d,server (poll + recv + reply + flush),%.1f\n", qd, r, s / r
  printf "%d,%d,model (both directions),%.1f\n", qd, r, m / r
}' | sed 's/\t//'
if [[ -n ${CG_TREE:-} ]]; then
  IFS=';' read -ra roots <<<"${CG_TREE_ROOTS:-}"
  python3 scripts/lib/cg_inline.py "$dir/nomodel.callgrind" "$bin" "$issued" "${fns[@]}" "${roots[@]}" \
    --depth "$CG_TREE" --min "${CG_TREE_MIN:-1}"
fi
if [[ -n ${CG_STEPS:-} ]]; then
  run steps "${toggles[@]}" --toggle-collect="$model_fn" --dump-instr=yes --separate-callers=8
  python3 scripts/lib/cg_steps.py "$dir/steps.callgrind" "$bin" "$issued" . \
    "client=${fns[0]},${fns[1]}" "server=${fns[2]}" --min "${CG_STEPS_MIN:-1}"
fi
