# Sourced by the bench scripts: `bin` (the nextmini binary), `work` (a private
# directory under /tmp named after $1) holding the state directory, so the
# script gets its own hub and PostgreSQL. On exit, whatever the script brought
# up is taken down (with any process left inside its namespaces) and the
# directory removed.
bin=${NEXTMINI_BIN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/release}/nextmini
work=$(mktemp -d "/tmp/nextmini-$1.XXXXXX")
chmod 755 "$work"   # the private PostgreSQL runs as another user
export NEXTMINI_STATE_DIR=$work/state
cleanup() { "$bin" down >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
