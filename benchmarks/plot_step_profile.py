"""Where a training step's GPU time goes, against the fewest bytes its quantizers must move.

Reads ``benchmarks/profile_step.py`` JSON files (kernel sums per step, grouped) and draws one stacked bar per model and
configuration, plus, for each quantized configuration, the time its quantizers and inverse rotations would take at the
large-copy bandwidth if every operand were read once and every output written once (:func:`quantizer_floor_bytes`).
The step's other groups are what quantizing cannot remove; the floor is what separate quantizer passes cannot beat.

    python3 benchmarks/plot_step_profile.py benchmarks/results/kernels/profile_800m_h200.json \\
        benchmarks/results/kernels/profile_20m_h200.json --copy-gbps 4246 \\
        --out benchmarks/results/kernels/step_profile_h200.png
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench import model_spec  # noqa: E402
from layer_variants import call_bytes  # noqa: E402
from quartet.model import ffn_hidden  # noqa: E402

#: benchmarks/profile_step.py's group of the quantizer and inverse-rotation kernels
QUANT = "quant (triton)"
#: profile groups in drawing order, with their colours; anything else is drawn as "other"
GROUPS = {"gemm": ("GEMMs", "#4c72b0"), QUANT: ("quantizers + inverse rotations", "#dd8452"),
          "inductor fused": ("inductor-fused elementwise", "#55a868"), "attention": ("attention", "#8172b3"),
          "optimizer": ("optimizer", "#937860")}


def block_linears(spec: dict) -> list[tuple[int, int]]:
    """(in, out) of every block linear of one layer (quartet.model: fused qkv, attention out, fused gate/up, MLP out)."""
    d = spec["d_model"]
    h = ffn_hidden(d, spec["ffn_multiple_of"])
    return [(d, 3 * d), (d, d), (d, 2 * h), (h, d)]


def quantizer_floor_bytes(spec: dict, tokens: int) -> float:
    """The fewest bytes one optimizer step's fused Quartet layers must move outside their GEMMs: each layer's six
    quantizer calls (``layer_variants.call_bytes``: X, W, E, Eᵀ, Ŵᵀ, X̂ᵀ) and its two masked inverse rotations
    (dX: bf16 in and out, the packed mask; dW: bf16 in, float32 out, the packed mask), every operand read once."""
    total = 0.0
    for k, n in block_linears(spec):
        c = call_bytes(tokens, k, n)
        total += c["x_fwd"] + c["w_fwd"] + c["e_rtn"] + c["et_rtn"] + c["wt_bwd"] + c["xt_bwd"]
        total += tokens * k * (2 + 2 + 1 / 8) + n * k * (2 + 4 + 1 / 8)
    return total * spec["n_layer"]


def bars(rows: list[dict], copy_gbps: float) -> list[dict]:
    """Per profiled configuration: ms per step of each group and, if it quantizes, its quantizers' byte floor."""
    out = []
    for r in rows:
        model, precision = r["model"].removeprefix("llama_"), r["config"].split(":")[0]
        groups = {k: v / 1e3 for k, v in r["groups_us_per_step"].items()}
        floor = None
        if QUANT in groups:
            floor = quantizer_floor_bytes(model_spec(model), r["tokens_per_step"]) / (copy_gbps * 1e9) * 1e3
        out.append({"model": model, "precision": precision, "label": f"{model} {precision}", "groups": groups,
                    "total": sum(groups.values()), "floor_ms": floor})
    return out


def plot(data: list[dict], copy_gbps: float, out: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.55 * len(data)))
    bf16_ms = {b["model"]: b["total"] for b in data if b["precision"] == "bf16"}
    floor_labelled = bf16_labelled = False
    for i, b in enumerate(data):
        left = 0.0
        for key, (label, colour) in [*GROUPS.items(), ("other", ("other", "#bbbbbb"))]:
            w = b["groups"].get(key, 0.0) if key != "other" else sum(
                v for k, v in b["groups"].items() if k not in GROUPS)
            ax.barh(i, w, left=left, color=colour, label=label if i == 0 else None, edgecolor="white", linewidth=0.5)
            if key == QUANT and b["floor_ms"]:
                ax.barh(i, b["floor_ms"], left=left, height=0.25, color="black",
                        label=None if floor_labelled else "quantizers at their byte floor")
                floor_labelled = True
            left += w
        ax.text(left, i, f" {b['total']:.1f} ms", va="center", fontsize=8, zorder=3,
                bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
        if b["floor_ms"] and b["model"] in bf16_ms:  # the same model's BF16 step: where a quantized step breaks even
            ax.plot([bf16_ms[b["model"]]] * 2, [i - 0.45, i + 0.45], color="black", linestyle="--", linewidth=1,
                    label=None if bf16_labelled else "the model's BF16 step")
            bf16_labelled = True
    ax.set_yticks(range(len(data)), [b["label"] for b in data])
    ax.invert_yaxis()
    ax.set_xlabel(f"GPU kernel time per optimizer step, ms (byte floor at the {copy_gbps:.0f} GB/s copy)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    ax.set_xlim(0, max(b["total"] for b in data) * 1.12)
    fig.tight_layout()
    fig.savefig(out, dpi=150)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="benchmarks/profile_step.py JSON files")
    ap.add_argument("--copy-gbps", type=float, required=True, help="the card's large-copy bandwidth (benchmarks/bench.py)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="Where the step's GPU time goes (compiled, kernel sums per step)")
    a = ap.parse_args(argv)
    rows = [r for p in a.profiles for r in json.loads(p.read_text())]
    data = bars(rows, a.copy_gbps)
    for b in data:
        print(f"{b['label']:22s} {b['total']:7.1f} ms" + (f"  quantizers {b['groups'][QUANT]:.1f} ms, "
                                                          f"byte floor {b['floor_ms']:.1f} ms" if b["floor_ms"] else ""))
    plot(data, a.copy_gbps, a.out, a.title)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
