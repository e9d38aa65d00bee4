"""Where the fused layer's quantizer time goes against each call's byte floor as a bar chart.

For each quantizer call of one layer step at one shape: uncapped with FP8 input scales per element, the default (the
per-kind register caps, input scales per row) and the call's floor — the fewest bytes it must
move (``layer_variants.call_bytes``) at the large-copy bandwidth. Reads ``layer_variants.py`` JSON files: one with the
``caps`` section (uncapped and capped figures) and one with the ``inscale`` section (scales per element / per row).

    python3 benchmarks/layer_variants.py --sections caps,layer --out caps.json       # on the GPU
    python3 benchmarks/layer_variants.py --sections inscale,layer --out inscale.json
    python3 benchmarks/plot_quantizer_floor.py --caps caps.json --inscale inscale.json --copy-gbps 3001 \\
        --out quantizer_floor.png
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

from layer_variants import ONE_PIECE_CAPS, call_bytes  # noqa: E402

#: the quantizer calls of one step (``layer_variants._layer_calls``), their labels and launch kinds
CALLS = {"x_fwd": ("X fwd", "1x128"), "w_fwd": ("W fwd", "128x128"), "e_rtn": ("E RTN", "1x128"),
         "e_sr": ("E SR", "1x128"), "et_rtn": ("Eᵀ RTN", "1x128 T"), "wt_bwd": ("Ŵᵀ", "128x128 T"),
         "xt_bwd": ("X̂ᵀ", "128x128 T")}


def rows(caps_json: dict, inscale_json: dict, shape: list, copy_gbps: float) -> list[dict]:
    """Per call: µs uncapped with scales per element, µs under the per-kind caps with scales per row (``tuned``), µs
    at the byte floor."""
    (caps,) = [r for r in caps_json["caps"] if r["shape"] == shape]
    f = caps["figures"]
    per_row = {}
    if inscale_json.get("in_scale") and inscale_json["in_scale"]["shape"] == shape:
        g = inscale_json["in_scale"]["figures"]
        per_row = {n: g[f"{n}@row"]["median_ms"] / g[f"{n}@element"]["median_ms"] for n in ("wt_bwd", "xt_bwd")}
    floor = call_bytes(*shape)
    out = []
    for name, (label, kind) in CALLS.items():
        cap = ONE_PIECE_CAPS[kind]
        now = f[f"{name}@{cap or 'free'}"]["median_ms"] * per_row.get(name, 1.0)
        out.append({"call": name, "label": label, "uncapped_us": f[f"{name}@free"]["median_ms"] * 1e3,
                    "tuned_us": now * 1e3, "floor_us": floor[name] / copy_gbps / 1e3})
    return out


def plot(data: list[dict], shape: list, copy_gbps: float, out: Path, note: str) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    xs = range(len(data))
    w = 0.27
    ax.bar([x - w for x in xs], [d["uncapped_us"] for d in data], w, label="uncapped, scales per element",
           color="#bdbdbd")
    ax.bar(list(xs), [d["tuned_us"] for d in data], w, label="caps per kind, scales per row",
           color="#d62728")
    ax.bar([x + w for x in xs], [d["floor_us"] for d in data], w, label=f"byte floor at {copy_gbps:.0f} GB/s copy",
           color="#1f77b4")
    for x, d in zip(xs, data):
        ax.text(x, d["tuned_us"] + 3, f"{d['floor_us'] / d['tuned_us']:.0%}", ha="center", fontsize=8)
    ax.set_xticks(list(xs), [d["label"] for d in data])
    ax.set_ylabel("µs per call (graphed, median)")
    ax.set_title(f"Quartet layer's quantizer calls, {'×'.join(map(str, shape))} (share of copy above red)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    fig.text(0.01, 0.01, note, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", type=Path, required=True, help="layer_variants JSON with the caps section")
    ap.add_argument("--inscale", type=Path, help="layer_variants JSON with the inscale section")
    ap.add_argument("--shape", default="16384,4096,4096")
    ap.add_argument("--copy-gbps", type=float, required=True, help="large-copy bandwidth (read + written), GB/s")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    shape = [int(v) for v in args.shape.split(",")]
    caps_json = json.loads(args.caps.read_text())
    inscale_json = json.loads(args.inscale.read_text()) if args.inscale else {}
    try:
        data = rows(caps_json, inscale_json, shape, args.copy_gbps)
    except (KeyError, ValueError) as e:
        ap.error(f"{args.caps} has no caps figures for shape {args.shape} with every call uncapped and capped ({e})")
    note = f"caps: {args.caps.parent.name}/{args.caps.name}" + (
        f"; per-row scales: {args.inscale.parent.name}/{args.inscale.name} (ratio applied)" if args.inscale else "")
    plot(data, shape, args.copy_gbps, args.out, note)
    args.out.with_suffix(".json").write_text(json.dumps({"shape": shape, "copy_GBps": args.copy_gbps, "calls": data},
                                                        indent=1))
    for d in data:
        print(f"{d['label']:8s} uncapped {d['uncapped_us']:6.1f} us  tuned {d['tuned_us']:6.1f} us  "
              f"floor {d['floor_us']:5.1f} us  ({d['floor_us'] / d['tuned_us']:.0%} of copy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
