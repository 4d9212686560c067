#!/usr/bin/env bash
# Creates a SEPARATE venv with the real sglang 0.5.23 package for the contract tests (pytest -m sglang), and
# unpacks 0.5.17's source beside it (scripts/sglang-source.sh).
#
# sglang pins CUDA builds (torch 2.14.1 + sgl-kernel + flashinfer ...) and cannot serve on a CPU machine, but
# its argument parser and its EAGLE-3 draft class can run on the CPU: we install sglang --no-deps plus the
# few packages those code paths import, and stub the two modules that only exist as CUDA builds
# (torchvision ops, vllm custom ops). Never install this into the project venv.
#
# Usage: scripts/setup-sglang.sh [VENV_DIR]      (default .venv-sglang; SGLANG_VENV overrides)
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${1:-${SGLANG_VENV:-.venv-sglang}}"
PY="${PYTHON:-python3}"
SGLANG_VERSION="0.5.23"
OLDER_VERSIONS="0.5.17"  # the GPU machine's release

start=$(date +%s)
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --no-input)

# torch first, from the local CPU wheel (sglang wants 2.14.1; 2.13 runs these code paths).
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" --no-deps "sglang==${SGLANG_VERSION}"

# Tier A: import sglang.srt.server_args and parse a command line.
"${PIP[@]}" --no-deps triton==3.9.0 numpy orjson psutil pybase64 requests urllib3 idna certifi packaging pillow \
  starlette anyio sniffio msgspec pydantic pydantic_core typing_inspection annotated-types pyzmq tqdm ipython \
  traitlets pygments aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist \
  typing_extensions decorator jedi parso matplotlib-inline prompt_toolkit wcwidth pexpect ptyprocess \
  stack_data executing asttokens pure_eval setproctitle
# Tier B: ServerArgs.resolve_once() (reads the draft's config.json through transformers).
"${PIP[@]}" --no-deps transformers==5.19.0 tokenizers==0.23.2 safetensors huggingface_hub hf-xet regex pyyaml \
  httpx httpcore h11 httpx2 httpcore2 truststore charset_normalizer typer click rich shellingham markdown-it-py mdurl annotated-doc filelock fsspec \
  dill apache-tvm-ffi==0.1.11 sentencepiece compressed-tensors loguru gguf
# Tier C: build LlamaForCausalLMEagle3 and run its load_weights.
"${PIP[@]}" --no-deps openai==2.8.0 distro partial_json_parser jiter sympy mpmath networkx jinja2 markupsafe

SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

# vllm stub: on non-CUDA hosts SGLang's rotary embedding imports vllm._custom_ops only to keep a reference.
mkdir -p "$SITE/vllm"
echo '"""draftlab stub: sglang imports vllm._custom_ops on non-CUDA hosts but never calls it here."""' \
  > "$SITE/vllm/__init__.py"
cat > "$SITE/vllm/_custom_ops.py" <<'EOF'
"""draftlab stub (see vllm/__init__.py): the names SGLang imports; calling one is an error."""


def rotary_embedding(*args, **kwargs):
    raise RuntimeError("draftlab's vllm stub: rotary_embedding is not available on this CPU-only venv")
EOF

# torchvision stub: srt/configs imports torchvision.transforms at module level; the registry wheels are
# CUDA builds that fail against torch+cpu. A meta-path finder answers every torchvision.* import with an
# inert module, so transformers' availability probe and attribute lookups both succeed.
cat > "$SITE/draftlab_torchvision_stub.py" <<'EOF'
"""draftlab stub: an inert torchvision for CPU-only contract tests of sglang (never used for real work)."""
import enum
import importlib.abc
import importlib.machinery
import sys
import types


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Inert(types.ModuleType):
    __path__ = []  # a package, so any submodule can be imported

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            return InterpolationMode
        return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: a[0] if a else None})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Inert(spec.name)
        module.__version__ = "0.0.0+draftlab.stub"
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
EOF
echo "import draftlab_torchvision_stub" > "$SITE/draftlab_torchvision_stub.pth"

"$VENV/bin/python" -c "import sglang.srt.server_args, sglang; print('sglang', sglang.__version__, 'ready')"

# Older releases draftlab ships a capture contract for, as source beside the venv (no install): the contract
# test reads their model files, and the launch test runs their argument parser on this venv's packages.
for old in $OLDER_VERSIONS; do
  scripts/sglang-source.sh "$VENV" "$old"
done
echo "installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1) on disk: $VENV"
