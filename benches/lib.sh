# Shared by the shell benches (`. benches/lib.sh` from the repository's root): a free port,
# a scratch directory `$D`, a throwaway redis-server on `$RPORT` (`start_redis`), and on exit
# the service `$SVC` (if set) killed, Redis stopped and `$D` removed; and the binaries a bench
# runs unless the caller names others: `$BIN`, `$TOOLS` (the release builds) and `$OHA` (PATH,
# else target/oha/bin, which `cargo bench --bench load` installs).
BIN=${BIN:-target/release/namelist}
TOOLS=${TOOLS:-target/release/namelist-tools}
OHA=${OHA:-$(command -v oha || echo target/oha/bin/oha)}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
D=$(mktemp -d -p "${TMPDIR:-/tmp}")
RPORT=$(free_port)
SVC=
cleanup() {
  [ -n "$SVC" ] && kill "$SVC" 2>/dev/null
  redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$D"
}
trap cleanup EXIT
# A fresh, empty redis-server on $RPORT (one already there is stopped), no persistence.
start_redis() {
  redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1 || true
  redis-server --port "$RPORT" --save '' --appendonly no --dir "$D" --daemonize yes --logfile "$D/redis.log"
  for _ in $(seq 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
