"""bench/inductor_h200_code.py reads Inductor's output code: each Triton kernel with its kind, its exps per element,
its loads, and whether it touches rows of the draft vocabulary. The code below has the shape Inductor writes (torch
2.11): the step-by-step loss's backward kernel, which computed every step's branch per element, and the one-pass
kernel that replaced it. Writing the code itself needs a CUDA build of torch, which CI does not have; the script
refuses a CPU build by name."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import BENCH, bench_script

SOURCE = '''
triton_poi_fused_cat_exp_0 = async_compile.triton('triton_poi_fused_cat_exp_0', \'\'\'
@triton.jit
def triton_poi_fused_cat_exp_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    x1 = xindex // 8192
    tmp0 = tl.load(in_ptr0 + (x0 + 8192*tmp25), tmp4, other=0.0).to(tl.float32)
    tmp1 = libdevice.exp(tmp0)
    tmp2 = tl.load(in_ptr1 + (x0 + 8192*tmp67), tmp46, other=0.0).to(tl.float32)
    tmp3 = libdevice.exp(tmp2)
    tmp4 = tl_math.exp(tmp3)
    tl.store(out_ptr0 + (x2), tmp4, None)
\'\'\', device_str='cuda')

triton_red_fused_logsumexp_1 = async_compile.triton('triton_red_fused_logsumexp_1', \'\'\'
@triton.jit
def triton_red_fused_logsumexp_1(in_ptr0, out_ptr0, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0 + (r0_1 + 576*x0), r0_mask, other=0.0)
    tl.store(out_ptr1 + (r0_1 + 8192*x0), tmp0, r0_mask)
    tl.store(out_ptr0 + (x0), tmp0, None)
\'\'\', device_str='cuda')
'''


def test_kernels_are_read_with_their_exps_loads_and_vocabulary_rows():
    found = bench_script("inductor_h200_code").kernels(SOURCE, vocab=8192)
    assert [k["name"] for k in found] == ["triton_poi_fused_cat_exp_0", "triton_red_fused_logsumexp_1"]
    poi, red = found
    assert (poi["kind"], poi["exps"], poi["loads"]) == ("poi", 3, 2)
    assert poi["reads_vocab_rows"] and not poi["stores_vocab_rows"]  # its store is flat (x2)
    assert (red["kind"], red["exps"], red["loads"]) == ("red", 0, 1)
    assert red["stores_vocab_rows"] and not red["reads_vocab_rows"]  # it reads hidden-width rows (576)
    assert bench_script("inductor_h200_code").kernels(SOURCE, vocab=4096)[0]["reads_vocab_rows"] is False


def test_a_cpu_build_of_torch_is_refused_by_name(tmp_path):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: the script would run")
    done = subprocess.run([sys.executable, str(BENCH / "inductor_h200_code.py"), "--out", str(tmp_path / "code")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "CPU build" in done.stderr and not (tmp_path / "code").exists()
