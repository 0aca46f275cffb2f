#!/usr/bin/env bash
# Trust boundaries with a real second user account (issue 14). Run as root (CI does); creates the
# throwaway user `rpcci` if missing. Checks, against the release `kv` binary:
#   1. another user cannot read a ring file `kv serve` created (mode 0600);
#   2. another user's live ring at the next ring name (`<shm>-1`, mode 0666) is not used by
#      `kv client`, which attaches only to the rings in `kv serve`'s manifest;
#   3. a ring manifest planted by another user is refused by `kv client` (exit 2, clear error).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "ci-second-user: needs root" >&2; exit 1; }
id rpcci >/dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin rpcci
as_rpcci() { su -s /bin/sh rpcci -c "$1"; }
kv=target/release/examples/kv
cargo build -q --release --example kv
shm="ci-trust-$$"
out=$(mktemp -d)
chmod 755 "$out"
cleanup() {
  [ -n "${serve_pid:-}" ] && kill "$serve_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$out" "/dev/shm/$shm"-* "/dev/shm/$shm.rings" "/dev/shm/$shm-planted.rings"
}
trap cleanup EXIT

"$kv" serve --shm "$shm" --daemons 1 --duration 60 >"$out/serve.log" &
serve_pid=$!
for _ in $(seq 100); do grep -q '^ready' "$out/serve.log" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready' "$out/serve.log" || { echo "kv serve did not start" >&2; cat "$out/serve.log"; exit 1; }

# 1. Ring and manifest are 0600, root's: rpcci cannot read them.
for f in "/dev/shm/$shm-0" "/dev/shm/$shm.rings"; do
  mode=$(stat -c %a "$f")
  [ "$mode" = 600 ] || { echo "FAIL: $f has mode $mode" >&2; exit 1; }
  if as_rpcci "cat $f >/dev/null 2>&1"; then echo "FAIL: rpcci read $f" >&2; exit 1; fi
done
echo "ok: ring and manifest are 0600 and unreadable by another user"

# 2. rpcci squats the next ring name with a world-writable file; the client ignores it.
as_rpcci "head -c 65536 /dev/zero > /dev/shm/$shm-1 && chmod 666 /dev/shm/$shm-1"
"$kv" client --shm "$shm" --clients 2 --duration 1 --deadline-ms 500 --quiet >"$out/client.log" 2>&1 \
  || { echo "FAIL: kv client did not pass next to a squatted ring" >&2; cat "$out/client.log"; exit 1; }
echo "ok: kv client ignored another user's ring at $shm-1"

# 3. A manifest planted by rpcci is refused with exit code 2 and a message naming the owner.
as_rpcci "printf 'DLGRINGS garbage' > /dev/shm/$shm-planted.rings && chmod 666 /dev/shm/$shm-planted.rings"
set +e
"$kv" client --shm "$shm-planted" --clients 1 --duration 1 --quiet >"$out/planted.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { echo "FAIL: planted manifest: exit $rc" >&2; cat "$out/planted.log"; exit 1; }
grep -qi "owner\|uid" "$out/planted.log" || { echo "FAIL: error does not name the owner" >&2; cat "$out/planted.log"; exit 1; }
echo "ok: another user's manifest refused: $(grep -i 'owner\|uid' "$out/planted.log" | head -1)"
