"""One launch of each main quantizer recipe (x = 16384 x 4096 bf16), for Nsight Compute:

    ncu --clock-control none -k regex:_mx_quant_kernel -c 3 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats python3 benchmarks/quant_profile.py
"""
import torch

from quartet.kernels.triton_quant import mx_quantize

x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
signs = (torch.randint(0, 2, (32,), device="cuda") * 2 - 1).float()
for _ in range(2):  # compile outside the profiled launches
    mx_quantize(x, rule="quest", mask=True)
    mx_quantize(x, rule="absmax", stochastic=True, signs=signs, seed=1)
    mx_quantize(x, rule="absmax", stochastic=True, signs=signs, seed=1, axis=0, deq=False, fp8="e5m2")
torch.cuda.synchronize()
mx_quantize(x, rule="quest", mask=True)
mx_quantize(x, rule="absmax", stochastic=True, signs=signs, seed=1)
mx_quantize(x, rule="absmax", stochastic=True, signs=signs, seed=1, axis=0, deq=False, fp8="e5m2")
torch.cuda.synchronize()
