"""Time the quantization library's QuantLinear (the path `quartet train` uses) on each backend.

    PYTHONPATH=. python3 benchmarks/seam_linear.py      # 16384 x 4096 x 4096, scheme quartet, fwd+bwd
"""
import json
import sys

import torch
import triton.testing

from quartet.kernels.backends import make_backend
from quartet.quant.backend import ReferenceBackend
from quartet.quant.config import PrecisionConfig
from quartet.quant.linear import QuantLinear
from quartet.quant.schemes import build_scheme

T, K, N = (int(v) for v in (sys.argv[1:4] if len(sys.argv) > 3 else (16384, 4096, 4096)))
dev = "cuda"
x = torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = torch.nn.Parameter(torch.randn(N, K, device=dev) * K ** -0.5)
e = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
res = {"shape": [T, K, N]}


def bench(fn):
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def bf16():
    torch.nn.functional.linear(x, w.to(torch.bfloat16)).backward(e)


res["bf16_ms"] = bench(bf16)
for name in ("hopper_fp8", "triton", "reference"):
    be = make_backend(name) if name != "reference" else ReferenceBackend()
    layer = QuantLinear(w, build_scheme(PrecisionConfig(name="quartet")), be, seed=1)
    res[f"quantlinear_{name}_ms"] = bench(lambda: layer(x).backward(e))
    res[f"quantlinear_{name}_ratio"] = res[f"quantlinear_{name}_ms"] / res["bf16_ms"]
print(json.dumps(res, indent=1))
