#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test fabric.
# Quiet and quick when everything is already there.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config python3 python3-jinja2
          python3-tomli  # codegen_tomli: the generator as on Python 3.9/3.10, which lack tomllib
          libfabric-dev libfabric-bin libcriterion-dev libhwloc-dev binutils
          python3-matplotlib  # tests/bench/plot.py, checked by bench.plot
          autoconf automake libtool) # tests/libfabric2.sh builds libfabric 2.x from source
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fabric: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
