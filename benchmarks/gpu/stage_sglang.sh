#!/usr/bin/env bash
# Stages the real SGLang for a GPU machine without a package index (Python 3.12, torch 2.11 + CUDA 13 there): the
# wheels of its serving path, pinned, installed into one folder and packed as STAGE/sglang/site.tar.xz (about
# 54 MiB). benchmarks/gpu/serve.sh unpacks it and gives its path to the server process only.
#   PY312=python3.12 bash benchmarks/gpu/stage_sglang.sh DOWNLOADS STAGE
# SGLang 0.5.17 is the newest release built for torch 2.11 (0.5.18 moves to 2.13). Its serving path loads these 40
# wheels; transformers 5.12.1 and tokenizers 0.22.2 are SGLang's pins, which the machine's own transformers breaks.
# What the triton attention backend never loads is stripped (FA3, the sm100, FlashMLA and InfLLM ops, xgrammar's
# static library: about 900 MiB), so never pass --attention-backend fa3 to this build.
set -euo pipefail
downloads=${1:?usage: stage_sglang.sh DOWNLOADS STAGE}
stage=${2:?usage: stage_sglang.sh DOWNLOADS STAGE}
py312=${PY312:-python3.12}
WHEELS=(sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 apache-tvm-ffi==0.1.11 xgrammar==0.2.1
        transformers==5.12.1 tokenizers==0.22.2 fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.3
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 uvicorn==0.55.0
        python-multipart==0.0.34 openai==2.6.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 msgspec==0.23.0
        orjson==3.13.0 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 setproctitle==1.3.8 pyzmq==27.3.0
        zstandard==0.25.0 compressed-tensors==0.20.1 loguru==0.8.0 gguf==0.19.0 ipython==9.19.1 traitlets==5.16.1
        jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 dill==0.4.1
        soundfile==0.13.1 cffi==2.1.1 pycparser==3.12)
get=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for n in 34 28 27 26 24 17 5; do get+=(--platform "manylinux_2_${n}_x86_64"); done
get+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p "$downloads/sglang"
"${get[@]}" -d "$downloads/sglang" "${WHEELS[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels"
python3 - "$downloads/sglang" "$work/wheels" <<'PY'
import pathlib, sys, zipfile

STRIP = {"sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
         "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", "xgrammar/lib/libxgrammar.a"}
src, dst = map(pathlib.Path, sys.argv[1:])
for wheel in sorted(src.glob("*.whl")):
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(dst / wheel.name, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.filename in STRIP:
                continue
            data = zin.read(item)
            if item.filename.endswith(".dist-info/RECORD"):  # pip checks the files it installs against RECORD
                kept = [line for line in data.decode().splitlines() if line.split(",")[0] not in STRIP]
                data = ("\n".join(kept) + "\n").encode()
            zout.writestr(item, data)
PY
"$py312" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$work"/wheels/*.whl
mkdir -p "$stage/sglang"
tar -C "$work/site" -cf - . | xz -9 -T0 > "$stage/sglang/site.tar.xz.tmp"
mv "$stage/sglang/site.tar.xz.tmp" "$stage/sglang/site.tar.xz"
echo "sglang: $(ls "$work/wheels" | wc -l) wheels, $(du -sh "$stage/sglang/site.tar.xz" | cut -f1) packed"
