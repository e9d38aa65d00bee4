"""What the quantizer kernels compile to on Hopper, without a GPU: registers, spills, shared memory, SASS instructions.

Triton compiles ahead of time for a target it is told about (``GPUTarget("cuda", 90, 32)``) with the ``ptxas`` it
ships; ``cuobjdump`` (shipped too) prints the resource usage and the SASS. So the questions a Nsight Compute
profile raises — how many instructions per element, how many registers (which set the occupancy: 65536 registers per
SM), whether a change adds spills — are answered here in seconds on the CPU box, before a device call is spent.

Each recipe is the fused layer's call (``quartet.kernels.triton_quant._mx_quant_kernel``) with the specialisation
``mx_quantize`` gives it at the training shape (16384×4096; stride 1 and multiples of 16 specialised as Triton does at
run time). Instructions are counted statically over the whole kernel (rare branches included), divided by the elements
each thread handles: an upper bound of the executed count per element, good for comparing versions of the kernel.

    .venv/bin/python benchmarks/sass_report.py                     # table of the layer's recipes
    .venv/bin/python benchmarks/sass_report.py --json out.json --sass-dir /tmp/sass   # + the SASS of each
    .venv/bin/python benchmarks/sass_report.py --maxnreg 96,80,64   # each also under register caps (spills, occupancy)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# compiled kernels, not the CPU interpreter's (which the test suite switches on): read before triton is imported
if os.environ.get("TRITON_INTERPRET") == "1" and __name__ == "__main__":
    del os.environ["TRITON_INTERPRET"]

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from quartet.kernels import triton_quant as tq  # noqa: E402

R, K = 16384, 4096
#: pointer argument -> Triton type of a default recipe (bf16 input, FP8 e4m3 output, bool mask)
POINTERS = dict(x_ptr="bf16", in_scale_ptr="fp32", signs_ptr="fp32", h_ptr="fp32", deq_ptr="bf16", mask_ptr="i8",
                codes_ptr="u8", scale_ptr="u8", fp8_ptr="fp8e4nv", rowexp_ptr="i32", flush_ptr="i32",
                bscale_ptr="fp32")
INTS = dict(R=R, K=K, stride_r=K, stride_k=1, in_s0=0, in_s1=0, bscale_ld=0, seed=12345, signs_bits=7)
BASE = dict(RULE=0, STOCHASTIC=False, HADAMARD=True, HAS_SIGNS=0, MODE=5, WRITE_MASK=True, WRITE_DEQ=False,
            DOT_BF16=1, IN_SCALE=0, COL_ORDER=False, FP8_SHIFT=6, SEED_PTR=False, BLOCK_R=32, BLOCK_K=128, IN_T=False,
            IN_BR=1, SCALE_BR=1, FACTOR=1.0, CAST_BF16=False, FP8_MIN_D=-8, MASK_BITS=True, IN_SCALE_VEC=False,
            SPLIT=1)
#: transposed read of a (T, N) tensor: logical rows are stored columns (stride 1)
_T = dict(R=K, K=R, stride_r=1, stride_k=K)
#: name -> (pointer overrides, int overrides, constexpr overrides, warps): the six calls of one layer step + SR
RECIPES = {
    "X fwd QuEST+mask 1x128": ({"mask_ptr": "i32"}, {}, {}, 4),
    "W fwd QuEST+mask 128x128 (f32 in)": ({"x_ptr": "fp32", "mask_ptr": "i32"}, {},
                                          dict(CAST_BF16=True, SCALE_BR=128, BLOCK_R=128), 16),
    "E absmax RTN 1x128": ({}, {}, dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2), 4),
    "E absmax SR 1x128": ({}, {}, dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2, STOCHASTIC=True), 4),
    "Et absmax RTN 1x128 (transposed)": ({}, _T, dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2, COL_ORDER=True), 4),
    "Et absmax SR 1x128 (transposed)": ({}, _T, dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2, COL_ORDER=True,
                                                      STOCHASTIC=True), 4),
    "Xt absmax RTN 128x128 (fp8 in, transposed)": (
        {"x_ptr": "fp8e4nv"}, {**_T, "in_s0": 1, "in_s1": R},
        dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2, COL_ORDER=True, IN_SCALE=3, IN_T=True, SCALE_BR=128, BLOCK_R=128,
             IN_SCALE_VEC=True), 16),
    # the 1x128 tile on the same work (linear.RIGHT_BLOCK = 1)
    "Xt absmax RTN 1x128 (fp8 in, transposed)": (
        {"x_ptr": "fp8e4nv"}, {**_T, "in_s0": 1, "in_s1": R},
        dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2, COL_ORDER=True, IN_SCALE=3, IN_T=True, IN_SCALE_VEC=True), 4),
    "Wt absmax RTN 128x128 (fp8 in, transposed)": (
        {"x_ptr": "fp8e4nv"}, {**_T, "R": K, "K": K, "stride_k": K, "in_s0": 32, "in_s1": 1},
        dict(RULE=1, WRITE_MASK=False, HAS_SIGNS=2, COL_ORDER=True, IN_SCALE=3, IN_T=True, IN_BR=128, SCALE_BR=128,
             BLOCK_R=128, IN_SCALE_VEC=True), 16),
}
# the SR backward's transposed 128x128 calls as the layer launches them (triton_quant's slices table and sliced warps;
# a sliced block keeps its group exponents as int8 until the block's fold)
_SR_T_SLICES = tq.BLOCK128_SPLIT_MEASURED["128x128 T SR"]
RECIPES.update({name.replace("RTN", "SR").replace("transposed)", f"transposed, {_SR_T_SLICES} slices)"): (
    {**ptr, "scale_ptr": "i8"}, ints, {**c, "STOCHASTIC": True, "BLOCK_R": 128 // _SR_T_SLICES, "SPLIT": _SR_T_SLICES},
    tq.BLOCK128_SPLIT_WARPS)
    for name, (ptr, ints, c, w) in list(RECIPES.items()) if name.startswith(("Xt", "Wt")) and "128x128" in name})
# the transposed FP8 inputs' scales loaded per element instead of per row (triton_quant.IN_SCALE_PER_ROW = False)
RECIPES.update({name[:-1] + ", scale per element)": (ptr, ints, {**c, "IN_SCALE_VEC": False}, w)
                for name, (ptr, ints, c, w) in list(RECIPES.items()) if c.get("IN_SCALE_VEC")})
#: the quantizer benchmark's two target recipes as the ``triton`` backend launches them: dequantized bf16 out, the QuEST
#: mask as bytes, on the direct reads' tile (its register cap ``MAXNREG_DIRECT`` is ``--maxnreg 80``)
_DIRECT = dict(MODE=0, WRITE_DEQ=True, MASK_BITS=False, BLOCK_R=tq.GPU_BLOCK_DIRECT[0], BLOCK_K=tq.GPU_BLOCK_DIRECT[1])
RECIPES.update({
    "X fwd QuEST+mask -> bf16 (direct tile)": ({"mask_ptr": "i8"}, {}, _DIRECT, tq.GPU_BLOCK_DIRECT[2]),
    "E absmax SR -> bf16 (direct tile)": ({}, {}, dict(_DIRECT, RULE=1, WRITE_MASK=False, HAS_SIGNS=1, STOCHASTIC=True),
                                          tq.GPU_BLOCK_DIRECT[2]),
})


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def compile_recipe(pointers: dict, ints: dict, consts: dict, warps: int, maxnreg: int | None = None):
    """The Triton kernel compiled for sm_90 with this specialisation (no GPU needed); ``maxnreg`` caps its registers
    per thread as ``mx_quantize(maxnreg=...)`` does at run time."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = tq._mx_quant_kernel
    if not hasattr(fn, "cache_key"):
        raise RuntimeError("the kernel was loaded for Triton's CPU interpreter (TRITON_INTERPRET=1): run this as a script")
    sig, constexprs, attrs = {}, {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n], constexprs[n] = "constexpr", consts[n]
        elif n in pointers:
            sig[n] = "*" + pointers[n]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in ints:
            v = ints[n]
            if v == 1:  # Triton specialises an integer argument equal to 1 as a constant
                sig[n], constexprs[n] = "constexpr", 1
            else:
                sig[n] = "i32" if abs(v) < 2**31 else "i64"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            raise KeyError(f"no value for the kernel argument {n!r}")
    return triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})})


def analyse(kernel, elems_per_thread: float, sass_path: Path | None = None) -> dict:
    """Registers, spills (the stack ptxas spills to, and the LDL/STL instructions that move them), shared memory,
    and the SASS opcode counts of a compiled kernel."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    if sass_path is not None:
        sass_path.write_text(sass)
    ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)", sass, re.M)
    mem = re.findall(r"\b((?:LDG|STG|LDS|STS|LDSM|STSM|LDL|STL)[.A-Z0-9_]*)", sass)
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    local = int(re.search(r"LOCAL:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    spills = sum(n for op, n in collections.Counter(mem).items() if op.startswith(("LDL", "STL")))
    return {"registers": regs, "local_bytes": local, "stack_bytes": stack, "spill_instructions": spills,
            "shared_bytes": kernel.metadata.shared,
            "sass_instructions": len(ops), "per_element": len(ops) / elems_per_thread,
            "opcodes": dict(collections.Counter(ops).most_common()), "memory_ops": dict(collections.Counter(mem))}


def report(names=None, sass_dir: Path | None = None, caps=(None,)) -> dict:
    """Compile and analyse each recipe (all by default) under each register cap of ``caps`` (None: uncapped); keys
    are the recipe's name, followed by ``@ maxnreg N`` for a capped build."""
    out = {}
    for name, (ptr, ints, consts, warps) in RECIPES.items():
        if names and name not in names:
            continue
        c = {**BASE, **consts}
        per_thread = c["BLOCK_R"] * c["BLOCK_K"] / (warps * 32)
        for cap in caps:
            k = compile_recipe({**POINTERS, **ptr}, {**INTS, **ints}, c, warps, cap)
            key = name + (f" @ maxnreg {cap}" if cap else "")
            path = sass_dir / (re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_") + ".sass") if sass_dir else None
            r = analyse(k, per_thread, path)
            # registers bound the resident warps: 65536 per SM, allocated per warp in units of 256
            per_warp = -(-r["registers"] * 32 // 256) * 256
            r["warps"], r["maxnreg"] = warps, cap
            r["occupancy_by_registers"] = min(64, (65536 // per_warp) // warps * warps) / 64
            out[key] = r
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sass-dir", type=Path)
    ap.add_argument("--recipe", action="append", help="only this recipe (repeatable; default: all)")
    ap.add_argument("--maxnreg", default="", help="comma list of register caps to build each recipe under as well "
                    "(as mx_quantize(maxnreg=...)), e.g. 96,80,64")
    args = ap.parse_args(argv)
    if args.sass_dir:
        args.sass_dir.mkdir(parents=True, exist_ok=True)
    out = report(args.recipe, args.sass_dir, (None, *(int(v) for v in args.maxnreg.split(",") if v)))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print(f"{'recipe':58s} {'regs':>4s} {'warps':>5s} {'occ':>4s} {'smem':>6s} {'spill':>5s} {'sass':>5s} {'/elem':>6s}"
          "  top opcodes")
    for name, r in out.items():
        top = " ".join(f"{o}:{n}" for o, n in list(r["opcodes"].items())[:6])
        print(f"{name:58s} {r['registers']:4d} {r['warps']:5d} {r['occupancy_by_registers']:4.0%} "
              f"{r['shared_bytes']:6d} {r['spill_instructions']:5d} {r['sass_instructions']:5d} {r['per_element']:6.1f}"
              f"  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
