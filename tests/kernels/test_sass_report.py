"""benchmarks/sass_report.py: the quantizer kernel compiled for Hopper (sm_90) on a machine without a GPU, and what
its resource report and SASS say. Needs Triton's bundled ptxas / cuobjdump (the CUDA wheel of Triton ships them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[2]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists(),
                                reason="Triton without its CUDA tools")


def test_recipes_compile_for_hopper_and_report_registers_and_instructions(tmp_path):
    # a process of its own: this suite loads the kernels for Triton's CPU interpreter, the report compiles them
    names = ["E absmax RTN 1x128", "E absmax SR 1x128", "Xt absmax RTN 128x128 (fp8 in, transposed)"]
    args = [a for n in names for a in ("--recipe", n)] + ["--maxnreg", "64"]
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sass_report.py"), *args, "--json",
                          str(tmp_path / "r.json"), "--sass-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=1800, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines()[0].startswith("recipe") and len(res.stdout.splitlines()) == 7
    out = json.loads((tmp_path / "r.json").read_text())
    capped = {k[:-len(" @ maxnreg 64")]: out.pop(k) for k in list(out) if k.endswith(" @ maxnreg 64")}
    assert sorted(out) == sorted(capped) == sorted(names)
    rtn, sr, xt = (out[k] for k in names)
    for r in out.values():
        # uncapped, ptxas takes more than 64 registers and spills nothing
        assert 64 < r["registers"] <= 255 and r["local_bytes"] == r["stack_bytes"] == r["spill_instructions"] == 0
        assert r["maxnreg"] is None
        assert r["sass_instructions"] > 200 and r["per_element"] > 5
        assert 0 < r["occupancy_by_registers"] <= 1
        # 16-byte global loads: the vectorised access the memory-bound part needs
        assert any(op.startswith("LDG.E.128") for op in r["memory_ops"])
    # the operand is rotated on the tensor cores (Hopper's warpgroup MMA), as the module says
    assert rtn["opcodes"].get("HGMMA", 0) > 0
    # stochastic rounding adds the Philox generator's integer work to the same recipe
    assert sr["sass_instructions"] > rtn["sass_instructions"] and sr["opcodes"]["IMAD"] > rtn["opcodes"]["IMAD"]
    # the 128x128 tile runs 16 warps and stages its tile through shared memory
    assert xt["warps"] == 16 and xt["shared_bytes"] > rtn["shared_bytes"]
    assert len(list(tmp_path.glob("*.sass"))) == 6 and "HGMMA" in (tmp_path / "E_absmax_RTN_1x128.sass").read_text()
    # capped at 64 registers (mx_quantize(maxnreg=64)): ptxas obeys, spills to the stack, and the occupancy the
    # registers allow doubles, for more instructions per element
    for name, c in capped.items():
        assert c["maxnreg"] == 64 and c["registers"] <= 64
        assert c["stack_bytes"] > 0 and c["spill_instructions"] > 0
        assert c["occupancy_by_registers"] == 2 * out[name]["occupancy_by_registers"] == 0.5
        assert c["sass_instructions"] > out[name]["sass_instructions"]
