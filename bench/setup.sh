#!/usr/bin/env bash
# What `make bench` needs beyond `make setup`, from Debian's packages: matplotlib
# for bench/plot.py (run by Debian's own /usr/bin/python3, so a pyenv or venv
# python on PATH does not matter) and `script` (util-linux) to give `nextmini up`
# a terminal in the start-up benchmark. Safe to run again.
set -euo pipefail

need=()
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || need+=(python3-matplotlib)
command -v script >/dev/null 2>&1 || need+=(bsdutils)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bench setup: missing ${need[*]}; run as root (sudo make bench) to install them" >&2
    exit 1
  fi
  echo "bench setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "bench setup: ok"
