"""One launch of each quantizer call the fused Quartet layer makes (x = 16384 x 4096 bf16), for Nsight Compute:

    ncu --clock-control none -k regex:_mx_quant_kernel -s 4 -c 4 --section SpeedOfLight --section Occupancy \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats \
        python3 benchmarks/quant_profile.py

The four profiled launches (after four warm-up launches that compile): forward QuEST + mask -> FP8 1x128 blocks,
backward RTN and SR -> FP8 1x128, and the transposed read of the saved FP8 X̂ -> FP8 128x128 blocks.
"""
import torch

from quartet.kernels.triton_quant import mx_quantize

x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
fp8 = dict(fp8="e4m3", deq=False)


def calls():
    q = mx_quantize(x, rule="quest", mask=True, fp8_block=1, **fp8)
    mx_quantize(x, rule="absmax", signs=0x1234, fp8_block=1, **fp8)
    mx_quantize(x, rule="absmax", stochastic=True, seed=1, signs=0x1234, fp8_block=1, **fp8)
    mx_quantize(q.fp8, axis=0, rule="absmax", signs=0x4321, fp8_block=128, in_scale=q.block_scale, in_scale_rows=1,
                **fp8)


calls()  # compile outside the profiled launches
torch.cuda.synchronize()
calls()
torch.cuda.synchronize()
