"""``quartet quant-stats``: error of every quantizer on Gaussian data (the paper's Table 2 columns).

Maths.
* MSE: E[(Q(x) − x)²]/σ² for x ~ N(0, σ²). Power-of-two (E8M0) scales make the error depend on where
  σ falls between two powers of two, so the figure is averaged over σ = 2^u with u on an even grid
  of [0, 1) (log-uniform across one octave).
* Misalignment (EDEN/DRIVE, Quartet §4): S = ⟨X, X⟩ / ⟨H(X, ξ), Q(H(X, ξ))⟩ with H(·, ξ) the
  random-sign block Hadamard; reported as 1 − E[1/S] over rows X of ``dim`` elements. An unbiased
  quantizer (stochastic rounding) has E[1/S] = 1; round-to-nearest shrinks values on average.

QuEST is reported twice: with the E8M0 (floored) scale that training uses and with the unrounded
scale 0.48707976·σ (``quest_nofloor``); the paper's 1.32e-2 is the latter — see docs/precision.md.
The NVFP4 rows compare Quartet II's quantizers (Four Over Six, MS-EDEN) with round-to-nearest and with the two
stochastic-rounding variants (the ``nvfp4`` scheme's, and the unbiased one with 16/17 headroom the paper uses).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from quartet.quant.hadamard import block_hadamard, random_signs
from quartet.quant.quantizers import QuantizerSpec, reference_quantize

__all__ = ["QUANTIZERS", "gaussian_stats", "cli_main"]

#: name -> (spec, description); the first three are the rows of the paper's Table 2.
QUANTIZERS: dict[str, tuple[QuantizerSpec, str]] = {
    "sr_absmax": (QuantizerSpec("absmax", stochastic=True), "MXFP4 absmax x3/4, stochastic rounding"),
    "rtn_absmax": (QuantizerSpec("absmax"), "MXFP4 absmax x3/4, round-to-nearest"),
    "quest": (QuantizerSpec("quest"), "QuEST MXFP4, E8M0 (floored) scale - as trained"),
    "quest_nofloor": (QuantizerSpec("quest", floor=False), "QuEST MXFP4, unrounded scale 0.487*sigma"),
    "ocp_absmax": (QuantizerSpec("ocp"), "MXFP4 OCP rule 2^(floor(log2 amax)-2), RTN, saturating"),
    "nvfp4": (QuantizerSpec("nvfp4", group=16), "NVFP4 16-groups, E4M3 + FP32 scales, RTN"),
    "nvfp4_4o6": (QuantizerSpec("nvfp4_4o6", group=16), "NVFP4 Four Over Six (amax to 6 or 4 per group), RTN"),
    "nvfp4_sr": (QuantizerSpec("nvfp4", group=16, stochastic=True),
                 "NVFP4 SR as the nvfp4 scheme's gradients (amax to 6: clips, slightly biased)"),
    "nvfp4_sr1617": (QuantizerSpec("nvfp4_sr1617", group=16), "NVFP4 SR, amax to 6*16/17: unbiased (Quartet II 3.1)"),
    "ms_eden": (QuantizerSpec("ms_eden", group=16), "MS-EDEN NVFP4: RTN + EDEN-corrected, SR'd E4M3 scales"),
    "mxfp8": (QuantizerSpec("mxfp8", group=32), "MXFP8: E4M3 elements, E8M0 scale per 32, RTN"),
    "nvfp4_2d": (QuantizerSpec("nvfp4", group=16, tile_rows=16), "NVFP4 16x16 tiles (NVIDIA recipe weights), RTN"),
    "fp8_1x128": (QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=128),
                  "FP8 E4M3, 1x128 tile scales (DeepSeek-V3 activations/gradients)"),
    "fp8_128x128": (QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=128, tile_rows=128),
                    "FP8 E4M3, 128x128 block scales (DeepSeek-V3 weights)"),
    "ms_fp4": (QuantizerSpec("ms_fp4"), "MS-FP4 per-row absmax E2M1 (row = dim)"),
    "fp8_e4m3": (QuantizerSpec("fp8", fmt="e4m3", scaling="row"), "FP8 E4M3, per-row current scaling"),
    "fp8_e5m2": (QuantizerSpec("fp8", fmt="e5m2", scaling="row"), "FP8 E5M2, per-row current scaling"),
    "int4": (QuantizerSpec("int4", scaling="row"), "INT4 symmetric absmax per row"),
    "luq": (QuantizerSpec("luq", stochastic=True), "LUQ log-FP4 (per tensor), unbiased"),
}

#: Published Gaussian figures. MXFP4 rows: Table 2 of the Quartet paper (v4). NVFP4 rows: Quartet II's
#: (arXiv 2601.22813) figures as its authors' notebook computes them (IST-DASLab/Quartet-II @8776a90,
#: notebooks/unbiasedness.ipynb: N(0,1)·2^U(0,8) rows of 128 after a 128-Hadamard; MS-EDEN there takes its
#: correction over the 128-element rotation group, ours over each 16-group as in the paper's v2 and the authors' fused RHT-128 kernel).
PAPER = {
    "sr_absmax": {"mse": 2.77e-2, "misalignment": 0.0},
    "rtn_absmax": {"mse": 1.37e-2, "misalignment": 9.3e-3},
    "quest": {"mse": 1.32e-2, "misalignment": 1.3e-2},
    "nvfp4": {"mse": 9.0e-3},
    "nvfp4_4o6": {"mse": 7.6e-3},
    "nvfp4_sr1617": {"mse": 2.35e-2, "misalignment": 0.0},
    "ms_eden": {"mse": 9.8e-3, "misalignment": 5.6e-4},
}


def gaussian_stats(names: list[str] | None = None, samples: int = 1 << 20, dim: int = 1024, scales: int = 16,
                   block: int = 32, seed: int = 0, progress: bool = False) -> list[dict]:
    """MSE and misalignment of each quantizer; ``samples`` Gaussian values per scale point."""
    names = list(names or QUANTIZERS)
    unknown = [n for n in names if n not in QUANTIZERS]
    if unknown:
        from quartet.errors import ConfigError

        raise ConfigError(f"quant-stats: unknown quantizer {unknown[0]!r}; allowed: {', '.join(QUANTIZERS)}")
    if dim % block or samples < dim:
        from quartet.errors import ConfigError

        raise ConfigError(f"quant-stats: --dim must be a multiple of {block} and <= --samples")
    rows = samples // dim
    gen = torch.Generator().manual_seed(seed)
    acc = {n: {"mse": 0.0, "inv_s": 0.0} for n in names}
    it = range(scales)
    if progress:
        from rich.progress import track

        it = track(it, description="quant-stats", transient=True, console=_stderr_console())
    for i in it:
        sigma = 2.0 ** ((i + 0.5) / scales)  # midpoints of an even grid of log2(sigma) in [0, 1)
        x = torch.randn(rows, dim, generator=gen) * sigma
        signs = random_signs(block, gen)
        xr = block_hadamard(x, block, signs)  # orthonormal: same distribution, same norms
        for n in names:
            spec = QUANTIZERS[n][0]
            q = reference_quantize(xr, spec, seed=int(torch.randint(0, 2**62, (1,), generator=gen))).dequantized()
            acc[n]["mse"] += float(((q - xr) ** 2).mean()) / sigma**2
            inv_s = (xr * q).sum(-1) / (x * x).sum(-1)
            acc[n]["inv_s"] += float(inv_s.mean())
    out = []
    for n in names:
        row = {"name": n, "mse": acc[n]["mse"] / scales, "misalignment": 1.0 - acc[n]["inv_s"] / scales,
               "description": QUANTIZERS[n][1]}
        if n in PAPER:
            row["paper_mse"] = PAPER[n]["mse"]
            if "misalignment" in PAPER[n]:
                row["paper_misalignment"] = PAPER[n]["misalignment"]
        out.append(row)
    return out


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet quant-stats [--json] [--samples N] [--dim D] [--scales S] [--seed S] [--only a,b]``."""
    p = argparse.ArgumentParser(prog="quartet quant-stats", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print JSON (one entry per quantizer) instead of a table")
    p.add_argument("--samples", type=int, default=1 << 20, help="Gaussian values per scale point (default 2^20)")
    p.add_argument("--dim", type=int, default=1024, help="row length for the misalignment ratio (default 1024)")
    p.add_argument("--scales", type=int, default=16, help="scale points across one octave (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="", help="comma-separated quantizer names (default: all)")
    args = p.parse_args(argv)
    names = [s for s in args.only.split(",") if s] or None
    from quartet.errors import ConfigError

    try:
        rows = gaussian_stats(names, args.samples, args.dim, args.scales, seed=args.seed, progress=not args.json)
    except ConfigError as exc:
        print(f"quartet quant-stats: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Quantizers on N(0, sigma^2), sigma log-uniform over one octave ({args.scales} points, "
                    f"{args.samples} values each)")
    for col in ("quantizer", "MSE / sigma^2", "paper", "misalignment 1-E[1/S]", "paper", "what"):
        t.add_column(col)

    def fmt(v):
        return "" if v is None else ("0" if v == 0 else f"{v:.3e}")

    for r in rows:
        t.add_row(r["name"], fmt(r["mse"]), fmt(r.get("paper_mse")), fmt(r["misalignment"]),
                  fmt(r.get("paper_misalignment")), r["description"])
    # piped into a file, a terminal-width console would truncate the quantizer names: give it room instead
    Console(width=None if sys.stdout.isatty() else 200).print(t)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
