#!/usr/bin/env bash
# Instructions per RDMA WRITE_IMM ping-pong round trip on the mlx5 device model, split into
# driver and model (example mlx5/examples/writeimm_callgrind.rs, release build, callgrind).
#
# Usage: scripts/callgrind-mlx5-pingpong.sh [round_trips]   (default 100000; needs valgrind)
#        CG_KEEP=dir scripts/callgrind-mlx5-pingpong.sh ...   keeps the callgrind profiles
#
# One round trip = A posts a signaled 64 B inline WRITE_IMM + doorbell, B polls its receive CQ,
# checks, re-posts its SRQ WQE, replies the same way and retires its requester CQE, A retires
# its requester CQE, polls the reply, checks, re-posts. Two passes over the same binary/input:
#   1. --collect-atstart=no --toggle-collect=writeimm_callgrind::round_trip
#      -> total: every instruction executed inside the N calls of round_trip (the warm-up runs
#         in another function and is not collected).
#   2. the same plus --toggle-collect='<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq'
#      -> collection toggles off on entry to the model's doorbell entry point and back on at its
#         return, so round_trip's inclusive cost in this pass (the sum of the call-arc costs into
#         it) is the round trip minus everything under ring_sq: the driver. (The warm-up's
#         ring_sq calls toggle collection on in this pass, so its program total is not used.)
#   model = total - driver. ring_sq (reached from SendQueue::ring_doorbell through
#   Arc<dyn SimDoorbell>) is the only way into the model on this path: CQ polls and SRQ
#   doorbells are plain memory accesses. Its cost includes taking and releasing the fabric mutex.
# Cross-checks (the script fails otherwise): pass 1's program total equals round_trip's
# inclusive cost, round_trip was entered N times, and model equals ring_sq's inclusive cost in
# pass 1 (the figure callgrind_annotate --inclusive=yes shows for it).
# "driver" is everything in the round trip that is not the model; the driver.* / app.* rows
# break it down from the inclusive costs of the example's #[inline(never)] driver_* / app_*
# functions in pass 1 (driver.post_doorbell excludes the model it calls; app.* is the message
# building and checking plus round_trip's own glue). Counts are per round trip: 2 WRITE_IMM,
# 2 doorbells, 4 CQEs polled, 2 SRQ re-posts. Callgrind counts are deterministic for a given
# binary and N (verified: identical across runs).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
ex=writeimm_callgrind
bin=target/release/examples/$ex
rt="$ex::round_trip"
model_fn='<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq'

cargo build -q --release -p mlx5 --example "$ex"
if [[ -n ${CG_KEEP:-} ]]; then
  dir=$CG_KEEP
  mkdir -p "$dir"
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi

run() { # name, extra callgrind options...
  local name=$1
  shift
  if ! valgrind --tool=callgrind --callgrind-out-file="$dir/$name.callgrind" \
    --collect-atstart=no "$@" "$bin" "$n" >"$dir/$name.stdout" 2>"$dir/$name.log"; then
    cat "$dir/$name.log" >&2
    exit 1
  fi
  grep -q "$n round trips verified" "$dir/$name.stdout" || {
    echo "example did not verify its round trips:" >&2
    cat "$dir/$name.stdout" >&2
    exit 1
  }
}
run total --toggle-collect="$rt"
run driver --toggle-collect="$rt" --toggle-collect="$model_fn"

# shellcheck source=lib/callgrind.sh
source scripts/lib/callgrind.sh
summary() { cg_summary "$1"; }
arcs1=$(cg_arcs "$dir/total.callgrind")
arcs2=$(cg_arcs "$dir/driver.callgrind")
field() { cg_field "$@"; }
inclusive() { field "$arcs1" "$1" 2; }

total=$(summary "$dir/total.callgrind")
driver=$(field "$arcs2" "$rt" 2)
model=$((total - driver))
model_incl=$(inclusive "$model_fn")
rt_calls=$(field "$arcs1" "$rt" 3)
fail() { echo "$*" >&2; exit 1; }
[[ $rt_calls == "$n" ]] || fail "round_trip entered $rt_calls times, expected $n"
(($(inclusive "$rt") == total)) || fail "pass 1 collected outside round_trip: $total vs $(inclusive "$rt")"
((model_incl > 0)) || fail "no cost under '$model_fn': symbol renamed, or the doorbell call was devirtualized and inlined"
((model == model_incl)) || fail "split mismatch: total-driver=$model, inclusive(ring_sq)=$model_incl"
post=$(inclusive "$ex::driver_post_write_imm")
psend=$(inclusive "$ex::driver_poll_send_cq")
precv=$(inclusive "$ex::driver_poll_recv_cq")
repost=$(inclusive "$ex::driver_repost_recv")
post_only=$((post - model_incl))
app=$((driver - post_only - psend - precv - repost))
echo "cross-checks ok: $n round trips, total $total, driver $driver, model $model = inclusive(ring_sq)" >&2

awk -v n="$n" -v total="$total" -v model="$model" -v driver="$driver" \
  -v post="$post_only" -v psend="$psend" -v precv="$precv" -v repost="$repost" -v app="$app" '
  function row(k, v) { printf "%s,%.2f\n", k, v / n }
  BEGIN {
    print "component,instructions_per_roundtrip"
    row("total", total); row("model", model); row("driver", driver)
    row("driver.post_doorbell", post); row("driver.poll_send_cq_retire", psend)
    row("driver.poll_recv_cq", precv); row("driver.repost_recv", repost)
    row("app.checks_and_glue", app)
  }'
