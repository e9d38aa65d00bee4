"""One launch of each quantizer call the fused Quartet layer makes (x = 16384 x 4096 bf16), for Nsight Compute:

    ncu --clock-control none -k regex:_mx_quant_kernel -s 5 -c 4 --section SpeedOfLight --section Occupancy \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats \
        python3 benchmarks/quant_profile.py [--set layer|right]

``-s 5`` skips the launch that makes the saved X̂ and the four warm-up launches that compile. ``--set layer``
(default): forward QuEST + mask -> FP8 1x128 blocks, backward RTN and SR -> FP8 1x128, and the transposed read of the
saved FP8 X̂ -> FP8 128x128 blocks. ``--set right``: why the transposed FP8 read of X̂ is slow — X̂ᵀ -> 128x128
blocks under the default register cap and uncapped, X̂ᵀ -> 1x128 blocks (the 1x128 tile on the same work) and, as the
yardstick, the transposed bf16 read of E (Eᵀ -> 1x128, RTN).
"""
import argparse

import torch

from quartet.kernels.triton_quant import mx_quantize

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--set", choices=("layer", "right"), default="layer")
which = ap.parse_args().set

x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
fp8 = dict(fp8="e4m3", deq=False)
q = mx_quantize(x, rule="quest", mask=True, fp8_block=1, **fp8)  # the saved X̂ (FP8, 1x128 block scales)
xt = dict(axis=0, rule="absmax", signs=0x4321, in_scale=q.block_scale, in_scale_rows=1, **fp8)


def calls():
    if which == "layer":
        mx_quantize(x, rule="quest", mask=True, fp8_block=1, **fp8)
        mx_quantize(x, rule="absmax", signs=0x1234, fp8_block=1, **fp8)
        mx_quantize(x, rule="absmax", stochastic=True, seed=1, signs=0x1234, fp8_block=1, **fp8)
        mx_quantize(q.fp8, fp8_block=128, **xt)
    else:
        mx_quantize(q.fp8, fp8_block=128, **xt)              # the default cap of its kind (64)
        mx_quantize(q.fp8, fp8_block=128, maxnreg=0, **xt)   # uncapped
        mx_quantize(q.fp8, fp8_block=1, **xt)                # the 1x128 tile
        mx_quantize(x, axis=0, rule="absmax", signs=0x1234, fp8_block=1, **fp8)  # Eᵀ from bf16


torch.cuda.synchronize()
calls()  # compile outside the profiled launches
torch.cuda.synchronize()
calls()
torch.cuda.synchronize()
