#!/usr/bin/env bash
# Builds the project's images from host files and imports them into the
# cluster's containerd (pods use them with imagePullPolicy: Never):
#   docker.io/nextmini/nextmini:dev   nextmini-operator, nextmini-agent, nextmini
#                                     (whichever exist in $NEXTMINI_BIN_DIR), ip,
#                                     busybox sh and applets, CA certificates
#   docker.io/nextmini/postgres:dev   Debian's PostgreSQL 15, entrypoint like the
#                                     official image's basics, runs as uid 999
#   docker.io/nextmini/tools:dev      curl, python3 (stdlib), ip, ping (iputils), busybox
#   docker.io/nextmini/worker:dev     the nextmini image plus curl and python3: a
#                                     packed topology's workerImage, so tests run
#                                     applications inside packed nodes
#   registry.k8s.io/pause:3.9         the sandbox image (our pause program)
#
#   images.sh [--no-import] [nextmini|postgres|tools|worker|pause]...   (default: all)
# Imported images are also tagged with the chart's appVersion, which its defaults
# run. NEXTMINI_CONTAINERD_SOCK imports into another containerd (k3s's).
# Tarballs are written to $NEXTMINI_K8S_CACHE/images.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

BIN_DIR=${NEXTMINI_BIN_DIR:-$(cd "$HERE/../.." && pwd)/target/release}
OUT_DIR=$CACHE/images
IMPORT_ARGS=()
WANT=()
for a in "$@"; do
  case $a in
    --no-import) IMPORT_ARGS=(--no-import) ;;
    nextmini | postgres | tools | worker | pause) WANT+=("$a") ;;
    *) die "unknown argument $a (expected --no-import, nextmini, postgres, tools, worker, pause)" ;;
  esac
done
((${#WANT[@]})) || WANT=(pause nextmini postgres tools worker)

ensure_packages busybox-static ca-certificates curl iputils-ping python3.11 postgresql-15 postgresql-client-15 iproute2 binutils tzdata
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/nextmini-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

BUSYBOX=$(command -v busybox || echo /bin/busybox)
# busybox_into DIR [SKIP...]: /bin/busybox (static) and a link per applet in
# DIR/usr/bin (the image's /bin is /usr/bin), except the names given.
busybox_into() {
  local dir=$1 a; shift
  mkdir -p "$dir/usr/bin"
  cp "$BUSYBOX" "$dir/usr/bin/busybox"
  for a in $("$BUSYBOX" --list); do
    [[ $a == busybox || " $* " == *" $a "* || -e $dir/usr/bin/$a ]] && continue
    ln -s busybox "$dir/usr/bin/$a"
  done
}
certs_into() {
  mkdir -p "$1/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"
}
size_of() { ls -l "$1" | awk '{printf "%.1f MiB", $5 / 1048576}'; }
built() { log "$1: $(size_of "$2") ($2)"; }

# ---------------------------------------------------------------- pause
image_pause() {
  local out=$OUT_DIR/pause.tar
  "$HERE/image.sh" --ref "$PAUSE_IMAGE" --out "$out" --file "$BIN/pause:/pause" --entrypoint /pause \
    --quiet "${IMPORT_ARGS[@]}"
  built "$PAUSE_IMAGE" "$out"
}

# ---------------------------------------------------------------- nextmini
# nextmini_into DIR REF BINARY...: those of the binaries found in $BIN_DIR,
# busybox and CA certificates (ip comes from the host, with its libraries, by
# image.sh).
nextmini_into() {
  local st=$1 ref=$2 b found=()
  shift 2
  mkdir -p "$st/usr/local/bin" "$st/etc"
  for b in "$@"; do
    if [[ -x $BIN_DIR/$b ]]; then
      strip --strip-debug -o "$st/usr/local/bin/$b" "$BIN_DIR/$b"
      found+=("$b")
    fi
  done
  ((${#found[@]})) || die "no nextmini binaries in $BIN_DIR (cargo build --release --bins, or set NEXTMINI_BIN_DIR)"
  log "$ref: ${found[*]} from $BIN_DIR"
  busybox_into "$st" ip ping
  certs_into "$st"
}

image_nextmini() {
  local ref=docker.io/nextmini/nextmini:dev out=$OUT_DIR/nextmini.tar st=$WORK/nextmini
  nextmini_into "$st" "$ref" nextmini-operator nextmini-agent nextmini
  local cmd=/bin/sh
  [[ -x $st/usr/local/bin/nextmini-operator ]] && cmd=/usr/local/bin/nextmini-operator
  "$HERE/image.sh" --ref "$ref" --out "$out" --dir "$st:/" --file /usr/sbin/ip:/usr/sbin/ip --cmd "$cmd" \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --quiet "${IMPORT_ARGS[@]}"
  built "$ref" "$out"
}

# ---------------------------------------------------------------- postgres
image_postgres() {
  local ref=docker.io/nextmini/postgres:dev out=$OUT_DIR/postgres.tar st=$WORK/postgres
  local pg=/usr/lib/postgresql/15
  [[ -x $pg/bin/postgres ]] || die "$pg/bin/postgres is missing (apt-get install postgresql-15)"
  mkdir -p "$st/etc" "$st/var/lib/postgresql/data" "$st/var/run/postgresql" "$st/docker-entrypoint-initdb.d" \
    "$st/usr/local/bin"
  busybox_into "$st"
  cat >"$st/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
  printf 'root:x:0:\npostgres:x:999:\nnogroup:x:65534:\n' >"$st/etc/group"
  install -m 0755 "$HERE/postgres-entrypoint.sh" "$st/usr/local/bin/docker-entrypoint.sh"
  chown -R 999:999 "$st/var/lib/postgresql" "$st/var/run/postgresql"
  chmod 2777 "$st/var/run/postgresql"
  chmod 0700 "$st/var/lib/postgresql/data"
  "$HERE/image.sh" --ref "$ref" --out "$out" --dir "$st:/" \
    --dir "$pg:$pg" --exclude './lib/pgxs' --exclude './lib/bitcode' \
    --dir "/usr/share/postgresql/15:/usr/share/postgresql/15" --exclude './man' \
    --dir /usr/share/zoneinfo:/usr/share/zoneinfo \
    --entrypoint /usr/local/bin/docker-entrypoint.sh --cmd postgres --user 999:999 \
    --env "PATH=$pg/bin:/usr/local/bin:/usr/bin:/bin" --env PGDATA=/var/lib/postgresql/data \
    --env LANG=C.UTF-8 --quiet "${IMPORT_ARGS[@]}"
  built "$ref" "$out"
}

# ---------------------------------------------------------------- tools
image_tools() {
  local ref=docker.io/nextmini/tools:dev out=$OUT_DIR/tools.tar st=$WORK/tools
  local py=/usr/bin/python3.11
  [[ -x $py ]] || die "$py is missing (apt-get install python3.11)"
  mkdir -p "$st/usr/bin" "$st/etc"
  busybox_into "$st" ip ping
  ln -s python3.11 "$st/usr/bin/python3"
  ln -s python3.11 "$st/usr/bin/python"
  certs_into "$st"
  "$HERE/image.sh" --ref "$ref" --out "$out" --dir "$st:/" \
    --file "$py:$py" --file /usr/bin/curl:/usr/bin/curl --file /usr/sbin/ip:/usr/sbin/ip \
    --file /usr/bin/ping:/usr/bin/ping \
    --dir /usr/lib/python3.11:/usr/lib/python3.11 \
    --exclude './test' --exclude './idlelib' --exclude './tkinter' --exclude './turtledemo' \
    --exclude './ensurepip' --exclude './lib2to3' --exclude '__pycache__' --exclude './config-3.11-x86_64-linux-gnu' \
    --cmd /bin/sh --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --quiet "${IMPORT_ARGS[@]}"
  built "$ref" "$out"
}

# ---------------------------------------------------------------- worker
image_worker() {
  local ref=docker.io/nextmini/worker:dev out=$OUT_DIR/worker.tar st=$WORK/worker
  local py=/usr/bin/python3.11
  [[ -x $py ]] || die "$py is missing (apt-get install python3.11)"
  nextmini_into "$st" "$ref" nextmini-agent nextmini
  ln -s python3.11 "$st/usr/bin/python3"
  "$HERE/image.sh" --ref "$ref" --out "$out" --dir "$st:/" \
    --file /usr/sbin/ip:/usr/sbin/ip --file "$py:$py" --file /usr/bin/curl:/usr/bin/curl \
    --file /usr/bin/ping:/usr/bin/ping \
    --dir /usr/lib/python3.11:/usr/lib/python3.11 \
    --exclude './test' --exclude './idlelib' --exclude './tkinter' --exclude './turtledemo' \
    --exclude './ensurepip' --exclude './lib2to3' --exclude '__pycache__' --exclude './config-3.11-x86_64-linux-gnu' \
    --cmd /bin/sh --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --quiet "${IMPORT_ARGS[@]}"
  built "$ref" "$out"
}

for w in "${WANT[@]}"; do
  t=$SECONDS
  "image_$w"
  log "$w: $((SECONDS - t))s"
done
if ((${#IMPORT_ARGS[@]} == 0)); then
  # The chart's defaults run its appVersion: the same images under that tag.
  APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$HERE/../../helm/nextmini/Chart.yaml")
  [[ -n $APP_VERSION ]] || die "no appVersion in helm/nextmini/Chart.yaml"
  for w in "${WANT[@]}"; do
    [[ $w == pause ]] && continue
    "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images tag --force \
      "docker.io/nextmini/$w:dev" "docker.io/nextmini/$w:$APP_VERSION" >/dev/null
  done
  log "images in containerd (k8s.io):"
  "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images ls | awk 'NR > 1 && /nextmini|pause/ {print "  " $1, $4 $5}' >&2
fi
log "done in $((SECONDS - _T0))s"
