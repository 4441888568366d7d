#!/usr/bin/env bash
# Builds a container image tarball from host files, without Docker, and
# imports it into the cluster's containerd (namespace k8s.io).
#
#   image.sh --ref REF --out FILE.tar [--file SRC[:DST]]... [--dir SRC[:DST]]...
#            [--exclude PATTERN]... [--entrypoint PATH|JSON] [--cmd ARG|JSON]
#            [--env K=V]... [--user UID[:GID]] [--workdir DIR] [--no-import] [--quiet]
#
# Every ELF file copied (by --file, or found inside a --dir) brings the shared
# libraries ldd names and the dynamic loader, at their host paths, so glibc
# binaries from the host run in the image. --dir keeps ownership and modes
# (stage a directory with chown'd files to set them); --exclude patterns are
# tar's, applied to --dir copies. The image has a root /etc/passwd and
# /etc/group unless files are given for them, and a /tmp. The tarball is in
# the `docker save` format written by go-containerregistry (build.sh's mkimage).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

REF="" OUT="" ENTRYPOINT="" CMD="" USER_="" WORKDIR="" IMPORT=1 QUIET=0
FILES=() DIRS=() EXCLUDES=() ENVS=()
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while (($#)); do
  case $1 in
    --ref) REF=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --file) FILES+=("$2"); shift 2 ;;
    --dir) DIRS+=("$2"); shift 2 ;;
    --exclude) EXCLUDES+=("--exclude=$2"); shift 2 ;;
    --entrypoint) ENTRYPOINT=$2; shift 2 ;;
    --cmd) CMD=$2; shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --user) USER_=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --no-import) IMPORT=0; shift ;;
    --quiet) QUIET=1; shift ;;
    -h | --help) usage ;;
    *) echo "image.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
[[ -n $REF && -n $OUT ]] || { echo "image.sh: --ref and --out are required" >&2; usage 2; }
[[ -x $BIN/mkimage ]] || die "$BIN/mkimage is missing: run e2e/cluster/build.sh first"
say() { ((QUIET)) || log "$@"; }

STAGE=$(mktemp -d /tmp/nextmini-image.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
ROOT=$STAGE/rootfs
mkdir -p "$ROOT"
# Mirror the host's merged /usr, so that /lib/x86_64-linux-gnu and
# /usr/lib/x86_64-linux-gnu are the same directory in the image too.
for d in bin sbin lib lib64; do
  if [[ -L /$d ]]; then ln -s "$(readlink "/$d")" "$ROOT/$d"; fi
done
mkdir -p "$ROOT/usr/bin" "$ROOT/usr/sbin" "$ROOT/usr/lib" "$ROOT/usr/lib64" "$ROOT/etc" "$ROOT/tmp" \
  "$ROOT/proc" "$ROOT/sys" "$ROOT/dev"
chmod 1777 "$ROOT/tmp"
echo "root:x:0:0:root:/root:/bin/sh" >"$ROOT/etc/passwd"
echo "root:x:0:" >"$ROOT/etc/group"

is_elf() { [[ -f $1 && ! -L $1 ]] && [[ $(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ') == '177ELF' ]]; }
ELVES=$STAGE/elves
: >"$ELVES"

for spec in "${FILES[@]}"; do
  src=${spec%%:*} dst=${spec#*:}
  [[ $spec == *:* ]] || dst=$src
  [[ -e $src ]] || die "--file $src does not exist"
  mkdir -p "$ROOT$(dirname "$dst")"
  cp -L --preserve=mode "$src" "$ROOT$dst"
  if is_elf "$src"; then echo "$src" >>"$ELVES"; fi
done

for spec in "${DIRS[@]}"; do
  src=${spec%%:*} dst=${spec#*:}
  [[ $spec == *:* ]] || dst=$src
  [[ -d $src ]] || die "--dir $src is not a directory"
  mkdir -p "$ROOT$dst"
  tar -C "$src" "${EXCLUDES[@]}" -cf - . | tar -C "$ROOT$dst" -xpf - --no-overwrite-dir --keep-directory-symlink
  # ldd of the staged copy names the same host libraries as the original.
  find "$ROOT$dst" -type f \( -perm -u+x -o -name '*.so*' \) |
    while read -r f; do if is_elf "$f"; then echo "$f"; fi; done >>"$ELVES"
done

# Shared libraries (and the loader) of every ELF file, at their host paths.
nlibs=0
while read -r lib; do
  [[ -z $lib || -e $ROOT$lib ]] && continue
  mkdir -p "$ROOT$(dirname "$lib")"
  cp -L "$lib" "$ROOT$lib"
  nlibs=$((nlibs + 1))
done < <(sort -u "$ELVES" | while read -r f; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^[[:space:]]*\/[^ ]+ \(/ {print $1}' || true
done | sort -u)
say "$REF: $(wc -l <"$ELVES") ELF files, $nlibs shared libraries"

mkdir -p "$(dirname "$OUT")"
mapfile -t entries < <(ls -A "$ROOT")
tar -C "$ROOT" --numeric-owner --sort=name --mtime=@0 -cf "$STAGE/layer.tar" "${entries[@]}"
args=(--ref "$REF" --out "$OUT.tmp" --layer "$STAGE/layer.tar")
[[ -n $ENTRYPOINT ]] && args+=(--entrypoint "$ENTRYPOINT")
[[ -n $CMD ]] && args+=(--cmd "$CMD")
[[ -n $USER_ ]] && args+=(--user "$USER_")
[[ -n $WORKDIR ]] && args+=(--workdir "$WORKDIR")
for e in "${ENVS[@]}"; do args+=(--env "$e"); done
"$BIN/mkimage" "${args[@]}"
mv "$OUT.tmp" "$OUT"
say "$REF: wrote $OUT ($(du -h "$OUT" | cut -f1), layer $(du -h "$STAGE/layer.tar" | cut -f1) uncompressed)"

if ((IMPORT)); then
  [[ -S $CONTAINERD_SOCK ]] || die "no containerd at $CONTAINERD_SOCK: start the cluster (up.sh) or pass --no-import"
  "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images import "$OUT" >"$STAGE/import.log" 2>&1 ||
    { cat "$STAGE/import.log" >&2; die "ctr images import $OUT failed"; }
  "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images ls -q | grep -x "$REF" >/dev/null ||
    die "imported $OUT but containerd does not list $REF"
  say "$REF: imported into containerd (k8s.io)"
fi
