#!/usr/bin/env bash
# Installs everything BeaconKV needs on a fresh Debian machine and installs the package.
# Idempotent: skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake g++ make libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
              libopenblas-dev nlohmann-json3-dev clang-format
              clang libclang-rt-14-dev)  # clang: ThreadSanitizer and libFuzzer builds
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check numpy pytest pybind11 scikit-build-core matplotlib tokenizers
echo "setup: building and installing the beaconkv package"
$PY -m pip install -q --disable-pip-version-check --no-build-isolation .
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
echo "setup: done"
