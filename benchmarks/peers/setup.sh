#!/usr/bin/env bash
# Builds the two peer trainers' venvs under $PEERS (outside the repository), CPU torch, pinned versions.
#   PEERS=/work/peers bash benchmarks/peers/setup.sh
set -euo pipefail
: "${PEERS:?set PEERS to a scratch folder outside the repository}"
mkdir -p "$PEERS"
pip=(-m pip install --quiet --disable-pip-version-check)
if [ ! -x "$PEERS/venv-spec/bin/python" ]; then
  python3 -m venv "$PEERS/venv-spec"
  "$PEERS/venv-spec/bin/python" "${pip[@]}" torch==2.13.0   # first: the CPU build stays
  "$PEERS/venv-spec/bin/python" "${pip[@]}" speculators==0.9.0 hs-connectors==0.9.0 torch==2.13.0 \
    transformers==5.19.0 datasets==5.1.0 accelerate==1.15.0
  # speculators declares torchvision/torchaudio; their builds for another torch break `import transformers`
  "$PEERS/venv-spec/bin/python" -m pip uninstall --quiet -y torchvision torchaudio
fi
if [ ! -x "$PEERS/venv-sf/bin/python" ]; then
  python3 -m venv "$PEERS/venv-sf"
  "$PEERS/venv-sf/bin/python" "${pip[@]}" torch==2.13.0
  # --no-deps: the wheel pins torch 2.11, transformers 5.8.1 and sglang, none of which offline training imports
  "$PEERS/venv-sf/bin/python" "${pip[@]}" --no-deps specforge==0.2.0
  "$PEERS/venv-sf/bin/python" "${pip[@]}" torch==2.13.0 transformers==5.17.0 datasets accelerate pydantic pyyaml \
    safetensors psutil tqdm numpy huggingface-hub typing-extensions
fi
"$PEERS/venv-spec/bin/python" -c "import speculators.train, transformers, torch; print('speculators ok', transformers.__version__, torch.__version__)"
"$PEERS/venv-sf/bin/python" -c "import specforge.cli, transformers, torch; print('specforge ok', transformers.__version__, torch.__version__)"
