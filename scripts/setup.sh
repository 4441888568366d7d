#!/usr/bin/env bash
# Installs what building and running Nextmini needs on a fresh Debian machine,
# skipping what is already there. Safe to run again.
#   scripts/setup.sh          what `make run` needs: build tools, PostgreSQL, iproute2, ping, curl
#   scripts/setup.sh --test   adds what only the tests need (`make test`): iperf3, Prometheus,
#                             Chromium, openssl, psycopg/pytest, cargo-fuzz
#   scripts/setup.sh --bench  adds what `make bench` needs on top of --test
set -euo pipefail

mode="${1:-}"
case "$mode" in
  "" | --test | --bench) ;;
  *) echo "setup: unknown option '$mode' (use --test or --bench)" >&2; exit 2 ;;
esac
testing=false
if [ "$mode" = --test ] || [ "$mode" = --bench ]; then testing=true; fi

need=()
have() { command -v "$1" >/dev/null 2>&1; }
pkg_for() { # command -> Debian package
  case "$1" in
    ip) echo iproute2 ;;
    ping) echo iputils-ping ;;
    cc) echo build-essential ;;
    pkg-config) echo pkg-config ;;
    *) echo "$1" ;;
  esac
}
commands=(ip ping curl python3 cc pkg-config psql)
# Only the tests: iperf3 measures link fidelity; prometheus and chromium: the
# observability e2e suite scrapes a topology with a real Prometheus and renders
# the HTML topology graph headless; openssl: the isolation suite forges a client
# certificate outside the control CA; traceroute: the TTL suite sees the
# emulated routers; tshark: the capture suite reads `nextmini capture`'s pcapng.
$testing && commands+=(iperf3 prometheus chromium openssl traceroute tshark)
for cmd in "${commands[@]}"; do
  if ! have "$cmd"; then
    case "$cmd" in
      psql) need+=(postgresql-client) ;;
      *) need+=("$(pkg_for "$cmd")") ;;
    esac
  fi
done
# The PostgreSQL server (initdb, postgres) lives outside PATH on Debian.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  need+=(postgresql)
fi
# `nextmini results --plot` draws its labels with a TrueType font.
if [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  need+=(fonts-dejavu-core)
fi

# `scripts/setup.sh --bench` (what `make bench` runs) also installs matplotlib for
# bench/plot.py, run by Debian's own /usr/bin/python3 so that a pyenv or venv
# python on PATH does not matter, and `script` (util-linux) to give `nextmini up`
# a terminal in the start-up benchmark, and ethtool to record the offloads of the
# devices on both sides of the hop benchmark.
if [ "$mode" = --bench ]; then
  /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || need+=(python3-matplotlib)
  have script || need+=(bsdutils)
  have ethtool || need+=(ethtool)
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need[*]}; run as root (sudo make setup) to install them" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts a cluster of its own on install; Nextmini runs a private one.
  if have pg_lsclusters; then
    pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
      pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
    done
  fi
fi

# The Python control package's tests (psycopg 3 from PyPI).
if $testing && ! python3 -c 'import psycopg, pytest' >/dev/null 2>&1; then
  echo "setup: installing psycopg and pytest for the Python control package"
  python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]>=3.1' 'pytest>=7' \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages 'psycopg[binary]>=3.1' 'pytest>=7'
fi

if ! have cargo; then
  echo "setup: no Rust toolchain (cargo) found; install one with rustup (Rust >= 1.90)" >&2
  exit 1
fi
# The fuzz targets' smoke run (fuzz/smoke.sh, a stage of `make test`) needs cargo-fuzz;
# it builds with nightly when rustup has it, else with stable and RUSTC_BOOTSTRAP=1.
if $testing && ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz (about 2 minutes, once)"
  cargo install --locked --quiet cargo-fuzz
fi
[ -e /dev/net/tun ] || { echo "setup: /dev/net/tun is missing (modprobe tun)" >&2; exit 1; }
echo "setup: ok"
