"""Each GPU's bf16 matmul peaks, in one place, for MFU two ways (issue 73).

`DATASHEET_TFLOPS` is the vendor's dense (no sparsity) bf16 tensor-core peak, the standard MFU denominator.
`MEASURED_TFLOPS` is what a dense bf16 matmul reached on the card; it is a second reading, never the goal's.
H200 790: the figure BENCHMARKS.md's MFU rows were computed against (an 8192^3 matmul ran at 764 there);
H100 798: the device notes' measured rate, no raw file in benchmarks/results records it.
"""

from __future__ import annotations

DATASHEET_TFLOPS = {"H100": 989.0, "H200": 989.0}  # H100 SXM and H200: 989.4 dense bf16
MEASURED_TFLOPS = {"H100": 798.0, "H200": 790.0}


def card(gpu_name: str | None) -> str | None:
    """The table's key for a torch.cuda.get_device_name() string ("NVIDIA H100 80GB HBM3" -> "H100"); None if unknown."""
    if not gpu_name:
        return None
    upper = gpu_name.upper()
    if "H100" in upper and ("PCIE" in upper or "NVL" in upper):
        return None  # other peaks than the SXM card's: not tabled
    return next((key for key in DATASHEET_TFLOPS if key in upper), None)


def mfu_two_ways(tflops: float, gpu_name: str | None) -> dict:
    """Achieved TFLOP/s over the card's datasheet peak (`mfu`) and over its measured matmul rate
    (`mfu_measured`); None where the card is not tabled."""
    key = card(gpu_name)
    sheet, measured = DATASHEET_TFLOPS.get(key), MEASURED_TFLOPS.get(key)
    return {"gpu": gpu_name, "peak_tflops": sheet, "measured_tflops": measured,
            "mfu": round(tflops / sheet, 4) if sheet else None,
            "mfu_measured": round(tflops / measured, 4) if measured else None}
