"""Does this torch + cuBLAS multiply two FP8 operands that are BOTH scaled per 1x128 block (``F.scaled_mm`` with
``BlockWise1x128`` on each side)? The fused Quartet layer scales its right operands (W, Ŵᵀ, X̂ᵀ) per 128x128 block,
whose quantizer runs at half the occupancy of the 1x128 one; this says whether the cheaper tile is an option.

    python3 benchmarks/scaled_mm_probe.py      # one GPU, seconds
"""
import torch, torch.nn.functional as F
from torch.nn.functional import ScalingType
a = torch.randn(256, 512, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(384, 512, device="cuda").to(torch.float8_e4m3fn)
sa = torch.ones(512 // 128, 256, device="cuda").t()   # (R, K/128) column-major, as the 1x128 recipe wants
sb = torch.ones(512 // 128, 384, device="cuda").t()
ref = a.float() @ b.float().t()
for name, sbb in (("(N, K/128) column-major", sb), ("(N, K/128) row-major", sb.contiguous())):
    try:
        out = F.scaled_mm(a, b.t(), sa, ScalingType.BlockWise1x128, sbb, ScalingType.BlockWise1x128,
                          output_dtype=torch.bfloat16)
        print(f"1x128 x 1x128, scale_b {name}: supported, rel err", ((out.float() - ref).norm() / ref.norm()).item())
    except Exception as exc:  # noqa: BLE001
        print(f"1x128 x 1x128, scale_b {name}: not supported:", type(exc).__name__, str(exc)[:300])
