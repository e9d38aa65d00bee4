"""Loading runs into one tidy DataFrame (one row per finished run), with validation.

Sources:
- a runs directory in the local run format (``<root>/<group>/<run_id>/summary.json``; see
  docs/ARCHITECTURE.md): :func:`load_runs_dir`;
- a CSV or Parquet table with columns ``n_params, tokens, forward, backward, loss``: :func:`load_table`;
- a wandb project through wandb's public API (``wandb.Api().runs("entity/project")``): :func:`load_wandb`;
- wandb offline run files (``run-<id>.wandb``): :func:`load_wandb_offline`.

Every loader returns a DataFrame with the columns :data:`COLUMNS` (extras kept) and puts the runs it
dropped, each with a reason (unfinished, failed, NaN, diverged, ...), in ``df.attrs["dropped"]`` and a
provenance record (source, sha256 or run ids) in ``df.attrs["provenance"]``. Dropped runs are logged.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError
from quartet import paths

log = logging.getLogger(__name__)

#: Columns of the tidy frame, in order.
COLUMNS = ("run_id", "model", "n_params", "tokens", "forward", "backward", "precision", "loss", "tokens_per_s",
           "steps", "seed", "group", "source")
#: Columns a table must have.
TABLE_REQUIRED = ("n_params", "tokens", "forward", "backward", "loss")
#: Label of the unquantized precision (the base law is fitted on forward == backward == BASE_LABEL).
BASE_LABEL = "bf16"
#: Plausible tokens per parameter of one run: outside it a row's units are almost surely mixed (tokens in
#: billions beside parameters in units, say).
TOKENS_PER_PARAM_RANGE = (0.01, 1e6)
PAPER_TABLE = Path(__file__).resolve().parent / "data" / "quartet_paper_losses.csv"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file (provenance of table inputs)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _precision_label(forward: str, backward: str) -> str:
    return forward if forward == backward else f"{forward}:{backward}"


def _check_units(rows: list[dict], dropped: list[dict], name: str, strict: bool) -> list[dict]:
    """Rows whose D/N lies outside :data:`TOKENS_PER_PARAM_RANGE` cannot share units with the others: a table
    (``strict``) is refused in one line, a run is dropped with the reason."""
    lo, hi = TOKENS_PER_PARAM_RANGE
    bad = [(r["run_id"], float(r["tokens"]) / float(r["n_params"])) for r in rows
           if not lo <= float(r["tokens"]) / float(r["n_params"]) <= hi]
    if bad and strict:
        shown = ", ".join(f"{rid} (D/N = {v:.3g})" for rid, v in bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise AnalysisError(f"{name}: {len(bad)} row(s) with tokens/n_params outside the plausible [{lo:g}, {hi:g}]: "
                            f"{shown}; are tokens and n_params in plain units (not millions or billions)?")
    ids = {rid for rid, _ in bad}
    dropped += [{"run_id": rid, "reason": f"tokens/n_params = {v:.3g} is outside the plausible [{lo:g}, {hi:g}]"}
                for rid, v in bad]
    return [r for r in rows if r["run_id"] not in ids]


def _drop_duplicates(rows: list[dict], dropped: list[dict]) -> list[dict]:
    """Exact repeats of a run (same N, D, precision, seed and loss) are one run listed twice: keep the first,
    drop the others with a reason (left in, they would count as evidence twice)."""
    seen: dict[tuple, str] = {}
    kept = []
    for r in rows:
        key = (float(r["n_params"]), float(r["tokens"]), r["forward"], r["backward"], str(r.get("precision")),
               float(r["loss"]), str(r.get("seed")))
        if key in seen:
            dropped.append({"run_id": r["run_id"], "reason": f"duplicate of {seen[key]} (same N, D, precision, "
                                                              f"seed and loss)"})
            continue
        seen[key] = r["run_id"]
        kept.append(r)
    return kept


def _finish(rows: list[dict], dropped: list[dict], provenance: dict, name: str = "runs",
            strict_units: bool = False) -> pd.DataFrame:
    for r in rows:  # labels are matched case-insensitively: BF16 is bf16
        r["forward"], r["backward"] = str(r["forward"]).strip().lower(), str(r["backward"]).strip().lower()
        if isinstance(r.get("precision"), str):
            r["precision"] = r["precision"].strip().lower()
    rows = _check_units(rows, dropped, name, strict_units)
    rows = _drop_duplicates(rows, dropped)
    for d in dropped:
        log.warning("dropped run %s: %s", d["run_id"], d["reason"])
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    extras = [c for c in df.columns if c not in COLUMNS]
    df = df[list(COLUMNS) + extras].reset_index(drop=True)
    for col in ("n_params", "tokens", "loss", "tokens_per_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df.attrs["dropped"] = dropped
    df.attrs["provenance"] = provenance
    return df


def _check_row(run_id: str, n, d, loss) -> str | None:
    """Reason to drop a run (non-finite / non-positive values), or None if it is usable."""
    try:
        n, d, loss = float(n), float(d), float(loss)
    except (TypeError, ValueError):
        return "n_params, tokens or loss is missing or not a number"
    if not math.isfinite(loss):
        return f"loss is {loss} (NaN/diverged)"
    if loss <= 0:
        return f"loss is {loss:g} (not positive: a cross-entropy loss cannot be; the summary is corrupt)"
    if not (math.isfinite(n) and n > 0 and math.isfinite(d) and d > 0):
        return f"n_params={n} / tokens={d} must be positive"
    return None


# ---------------------------------------------------------------- tables
def load_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV/Parquet loss table and validate it.

    Required columns: ``n_params, tokens, forward, backward, loss``; extras (``model``, ``steps``,
    ``run_id``, ...) are kept. Rows whose loss is NaN/inf are dropped with a reason (runs that
    diverged); a non-positive loss, N or D is an error.
    """
    path = Path(path)
    if not path.exists():
        raise AnalysisError(f"no such table: {path}")
    if path.suffix.lower() not in (".parquet", ".pq", ".csv", ".tsv", ".txt"):
        raise AnalysisError(f"table {path.name}: unsupported extension {path.suffix!r}; use .csv or .parquet")
    raw = _read_table(path)
    if raw.empty:
        raise AnalysisError(f"table {path}: no rows (only a header)")
    provenance = {"kind": "table", "path": str(path), "sha256": sha256_file(path)}
    return frame_from_table(raw, provenance=provenance, name=path.name)


def _read_table(path: Path) -> pd.DataFrame:
    """pandas' reader for the file's type, its errors as one line naming the file."""
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        sep = "\t" if path.suffix.lower() == ".tsv" else ","
        raw = pd.read_csv(path, sep=sep)
        raw.attrs["ragged"] = _ragged_rows(path, sep, len(raw.columns))
        return raw
    except pd.errors.EmptyDataError:
        raise AnalysisError(f"table {path}: the file is empty") from None
    except pd.errors.ParserError as exc:
        raise AnalysisError(f"table {path}: not a well-formed table ({str(exc).strip().splitlines()[-1]})") from None
    except UnicodeDecodeError:
        raise AnalysisError(f"table {path}: not UTF-8 text") from None
    except (OSError, ValueError, ImportError) as exc:
        raise AnalysisError(f"table {path}: cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None


def _ragged_rows(path: Path, sep: str, n_columns: int) -> dict[int, int]:
    """Data rows (0-based, as pandas numbers them) with fewer fields than the header: {row: fields}."""
    import csv

    with open(path, newline="", encoding="utf-8") as fh:
        lines = [r for r in csv.reader(fh, delimiter=sep) if r]  # pandas skips blank lines too
    return {i: len(r) for i, r in enumerate(lines[1:]) if len(r) < n_columns}


def frame_from_table(raw: pd.DataFrame, provenance: dict | None = None, name: str = "table") -> pd.DataFrame:
    """Validate an in-memory table (same rules as :func:`load_table`) and return the tidy frame."""
    missing = [c for c in TABLE_REQUIRED if c not in raw.columns]
    if missing:
        raise AnalysisError(f"{name}: missing column(s) {', '.join(missing)}; a table needs "
                            f"{', '.join(TABLE_REQUIRED)} (extra columns are allowed)")
    rows, dropped = [], []
    ragged = raw.attrs.get("ragged", {})
    labels: dict[str, tuple[int, str, str]] = {}  # precision -> (first row, forward, backward)
    for i, rec in enumerate(raw.to_dict("records")):
        rid = str(rec.get("run_id") if isinstance(rec.get("run_id"), str) else f"row{i}")
        if i in ragged:  # a truncated line: its missing fields read as NaN, which is no diverged run
            dropped.append({"run_id": rid, "reason": f"ragged row: {ragged[i]} of {len(raw.columns)} fields "
                                                      f"(a truncated line of the table)"})
            continue
        for col in ("n_params", "tokens", "loss"):
            try:
                val = float(rec[col])
            except (TypeError, ValueError):
                raise AnalysisError(f"{name} row {i}: column {col} is not a number ({rec[col]!r})") from None
            if math.isfinite(val) and val <= 0:
                raise AnalysisError(f"{name} row {i}: {col} must be positive (got {val})")
            if col != "loss" and not math.isfinite(val):
                raise AnalysisError(f"{name} row {i}: {col} must be a finite number (got {val})")
        reason = _check_row(rid, rec["n_params"], rec["tokens"], rec["loss"])
        if reason:
            dropped.append({"run_id": rid, "reason": reason})
            continue
        fw, bw = str(rec["forward"]).strip().lower(), str(rec["backward"]).strip().lower()
        _check_precision(rec.get("precision"), fw, bw, f"{name} row {i} ({rid})", i, labels)
        row = {**rec, "run_id": rid, "forward": fw, "backward": bw, "loss": float(rec["loss"]),
               "precision": rec.get("precision") if isinstance(rec.get("precision"), str) else _precision_label(fw, bw),
               "model": rec.get("model", f"{float(rec['n_params']) / 1e6:.3g}M"), "source": rec.get("source", name)}
        rows.append(row)
    prov = {**(provenance or {"kind": "table", "name": name}), "run_ids": [r["run_id"] for r in rows]}
    return _finish(rows, dropped, prov, name, strict_units=True)


def _check_precision(precision, fw: str, bw: str, where: str, i: int, labels: dict) -> None:
    """AnalysisError (one line naming the row) when a row's precision contradicts its forward/backward labels: the
    base precision is exactly the rows with forward == backward == :data:`BASE_LABEL` (the base law is fitted on
    those; a quantized row labelled so would enter it, and vice versa), and a precision has one pair of labels
    (one efficiency fit each). ``labels`` collects each precision's first row."""
    if not isinstance(precision, str) or not precision.strip():
        return  # no name: the labels name the precision
    name = precision.strip().lower()
    if (name == BASE_LABEL) != (fw == bw == BASE_LABEL):
        why = (f"the base precision's rows have forward = backward = {BASE_LABEL}" if name == BASE_LABEL
               else f"forward = backward = {BASE_LABEL} is the base precision")
        raise AnalysisError(f"{where}: precision {precision!r} contradicts forward={fw}, backward={bw} ({why}); fix "
                            f"the row's labels")
    first = labels.setdefault(name, (i, fw, bw))
    if first[1:] != (fw, bw):
        raise AnalysisError(f"{where}: precision {precision!r} has forward={fw}, backward={bw}, but row {first[0]} "
                            f"gives it forward={first[1]}, backward={first[2]}; a precision has one pair of labels")


def load_paper() -> pd.DataFrame:
    """The Quartet paper's published loss grid shipped in ``analysis/data`` (see its README)."""
    df = load_table(PAPER_TABLE)
    df.attrs["provenance"]["kind"] = "paper"
    return df


# ---------------------------------------------------------------- runs directory
def _read_yaml(path: Path) -> dict:
    if not path.exists():
        return {}
    import yaml

    try:  # a corrupt config.yaml (not UTF-8, not YAML) is as good as none: the summary carries the numbers
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _nested(d: dict, dotted: str, default=None):
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def _run_dirs(root: Path) -> list[Path]:
    # A run folder is one the trainer or the cluster has touched (config.yaml alone may be a snapshot).
    markers = (paths.SUMMARY, paths.STATE, paths.METRICS)
    found = set()
    for m in markers:
        for p in root.rglob(m):
            if paths.CKPT in p.parts or "wandb" in p.parts:
                continue
            found.add(p.parent)
    return sorted(found)


def load_runs_dir(root: str | Path) -> pd.DataFrame:
    """Every run under ``root`` (``<root>/<group>/<run_id>/``, or a single group / run folder).

    A run is used only if its ``summary.json`` exists (the trainer writes it atomically on
    completion); others are dropped with the state from ``state.json`` as the reason. Runs with a
    non-finite loss, or a final loss above the first logged training loss (diverged), are dropped.
    """
    root = Path(root)
    if not root.is_dir():
        raise AnalysisError(f"runs directory {root} does not exist")
    rows, dropped = [], []
    for run_dir in _run_dirs(root):
        rid = run_dir.name
        end = paths.outcome(run_dir)
        if end != "finished":
            state = paths.read_state(run_dir)
            st = state.get("state", "unknown")
            if end == "corrupt":
                reason = f"{run_dir / paths.SUMMARY} is unreadable (not a UTF-8 JSON object)"
            elif end == "failed":
                err = (state.get("error") or "").strip().splitlines()
                reason = f"failed at step {state.get('step')}: {err[-1] if err else 'see error.txt'}"
            else:
                reason = f"unfinished (state {st}, step {state.get('step', '?')}/{state.get('total_steps', '?')})"
            dropped.append({"run_id": rid, "reason": reason, "path": str(run_dir)})
            continue
        summary = paths.read_summary(run_dir)
        if (summary.get("branch") or {}).get("role") == "trunk":  # docs/branches.md: no decay, no budget's loss
            dropped.append({"run_id": rid, "reason": "budget-branch trunk (constant LR, never decayed): its branches "
                            "are the runs", "path": str(run_dir)})
            continue
        cfg = _read_yaml(run_dir / paths.CONFIG)
        rid = str(summary.get("run_id", rid))
        fw = summary.get("forward") or _nested(cfg, "precision.forward")
        bw = summary.get("backward") or _nested(cfg, "precision.backward")
        n = summary.get("n_params")
        d = summary.get("tokens")
        loss = summary.get("val_loss")
        missing = [k for k, v in (("forward", fw), ("backward", bw), ("n_params", n), ("tokens", d),
                                  ("val_loss", loss)) if v is None]
        if missing:
            dropped.append({"run_id": rid, "reason": f"summary.json lacks {', '.join(missing)}", "path": str(run_dir)})
            continue
        reason = _check_row(rid, n, d, loss)
        if reason is None:
            first = _first_train_loss(run_dir)
            if first is not None and float(loss) > first:
                reason = f"diverged (final loss {float(loss):.4g} > first logged loss {first:.4g})"
        if reason:
            dropped.append({"run_id": rid, "reason": reason, "path": str(run_dir)})
            continue
        rows.append({
            "run_id": rid, "model": summary.get("model", _nested(cfg, "model.name", "?")),
            "n_params": float(n), "tokens": float(d), "forward": str(fw), "backward": str(bw),
            "precision": summary.get("precision") or _nested(cfg, "precision.name") or _precision_label(fw, bw),
            "loss": float(loss), "tokens_per_s": summary.get("tokens_per_s"), "steps": summary.get("steps"),
            "seed": summary.get("seed"), "group": summary.get("name", run_dir.parent.name),
            "source": "runs", "path": str(run_dir), "train_loss": summary.get("train_loss"),
            "wall_clock_s": summary.get("wall_clock_s"), "config_hash": summary.get("config_hash"),
        })
    if not rows:
        why = "; ".join(f"{d['run_id']}: {d['reason']}" for d in dropped[:5]) or "no run folders found"
        raise AnalysisError(f"no finished runs under {root} ({why})")
    prov = {"kind": "runs", "path": str(root), "run_ids": sorted(r["run_id"] for r in rows)}
    return _finish(rows, dropped, prov, str(root))


def _first_train_loss(run_dir: Path) -> float | None:
    """The loss of the run's first metrics row (None when there is none, or it is torn or not finite)."""
    try:
        for _, _, row in paths.metrics_lines(run_dir):
            val = row.get("loss") if isinstance(row, dict) else None
            return float(val) if val is not None and math.isfinite(float(val)) else None
    except (OSError, TypeError, ValueError):
        return None
    return None


def load_curve(run: str | Path | pd.Series) -> pd.DataFrame:
    """The logged curve of one run (``metrics.jsonl``) as a DataFrame; ``run`` is a folder or a row."""
    path = Path(run["path"]) if isinstance(run, pd.Series) else Path(run)
    if not (path / paths.METRICS).exists():
        raise AnalysisError(f"{path} has no {paths.METRICS}")
    # a torn line (a write cut short) is no row; rows a resume could not bring back are named in summary.json
    return pd.DataFrame([row for _, _, row in paths.metrics_lines(path) if isinstance(row, dict)])


# ---------------------------------------------------------------- wandb
_SUMMARY_KEYS = {"n_params": ("n_params", "model/n_params"), "tokens": ("tokens", "final/tokens"),
                 "loss": ("val_loss", "final/val_loss", "val/loss"), "tokens_per_s": ("tokens_per_s",),
                 "steps": ("steps", "_step")}


def _first(d: dict, keys: Iterable[str]):
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
        v = _nested(d, k) if "." in k else None
        if v is not None:
            return v
    return None


def _flat_get(cfg: dict, dotted: str):
    """Config value by dotted key, whether wandb stored it nested or flattened ("a.b")."""
    if dotted in cfg:
        return cfg[dotted]
    return _nested(cfg, dotted)


def _wandb_row(rid: str, state: str, summary: dict, config: dict, group: str | None) -> tuple[dict | None, str | None]:
    if state not in ("finished",):
        return None, f"wandb state {state!r} (unfinished)"
    vals = {k: _first(summary, keys) for k, keys in _SUMMARY_KEYS.items()}
    # quartet's trainer mirrors its resolved config (with a "derived" block: n_params, tokens, ...)
    # into the wandb config and logs tokens / val_loss; fall back on those keys.
    if vals["n_params"] is None:
        vals["n_params"] = _flat_get(config, "n_params") or _flat_get(config, "derived.n_params")
    if vals["tokens"] is None:
        vals["tokens"] = _flat_get(config, "derived.tokens")
    fw = summary.get("forward") or _flat_get(config, "precision.forward")
    bw = summary.get("backward") or _flat_get(config, "precision.backward")
    missing = [k for k, v in (("forward", fw), ("backward", bw), ("n_params", vals["n_params"]),
                              ("tokens", vals["tokens"]), ("val_loss", vals["loss"])) if v is None]
    if missing:
        return None, f"run lacks {', '.join(missing)} in its summary/config"
    reason = _check_row(rid, vals["n_params"], vals["tokens"], vals["loss"])
    if reason:
        return None, reason
    return {"run_id": summary.get("run_id") or config.get("run_id") or rid, "model": summary.get("model") or _flat_get(config, "model.name"),
            "n_params": float(vals["n_params"]), "tokens": float(vals["tokens"]), "forward": str(fw),
            "backward": str(bw), "precision": summary.get("precision") or _flat_get(config, "precision.name")
            or _precision_label(fw, bw), "loss": float(vals["loss"]), "tokens_per_s": vals["tokens_per_s"],
            "steps": vals["steps"], "seed": summary.get("seed") or _flat_get(config, "run.seed"),
            "group": group, "source": "wandb", "wandb_id": rid}, None


def load_wandb(path: str, api: Any = None, filters: dict | None = None) -> pd.DataFrame:
    """Finished runs of a wandb project ``entity/project`` through wandb's public API.

    ``api`` defaults to ``wandb.Api()``; pass any object with the same ``runs(path, filters)`` method
    (e.g. a client replaying recorded responses) to read without network. Runs not in state
    ``finished``, or lacking N / tokens / val_loss / precision labels, are dropped with a reason.
    """
    path = path.removeprefix("wandb:")
    if path.count("/") != 1:
        raise AnalysisError(f"wandb source must be entity/project (got {path!r})")
    try:
        if api is None:
            import wandb

            api = wandb.Api(timeout=60)
        runs = list(api.runs(path, filters=filters or {}))
    except AnalysisError:
        raise
    except Exception as exc:  # noqa: BLE001 - no login, no network, no such project: one line, not wandb's traceback
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise AnalysisError(f"wandb:{path}: cannot read the project ({type(exc).__name__}: {first}); log in with "
                            f"`wandb login` (or set WANDB_API_KEY), or fit a runs folder / loss table instead") from None
    rows, dropped = [], []
    for run in runs:
        summary = dict(run.summary) if not isinstance(run.summary, dict) else run.summary
        row, reason = _wandb_row(run.id, run.state, dict(summary), dict(run.config), getattr(run, "group", None))
        if reason:
            dropped.append({"run_id": run.id, "reason": reason})
        else:
            rows.append(row)
    if not rows:
        raise AnalysisError(f"no finished runs with the needed keys in wandb project {path}")
    return _finish(rows, dropped, {"kind": "wandb", "path": path, "run_ids": sorted(r["run_id"] for r in rows)})


def _wandb_records(path: Path):
    """Raw protobuf records of a wandb ``.wandb`` file (LevelDB-log framing, 32 KiB blocks)."""
    import struct

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise AnalysisError(f"{path} is not a wandb run file")
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too small for a header: skip to next block
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk = data[pos:pos + n]
        pos += n
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk


def read_wandb_file(path: str | Path) -> dict:
    """Parse one offline ``run-<id>.wandb`` file into {id, config, summary, history, finished}.

    wandb's record format is internal; this reads the history / config / summary / exit records.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    out: dict = {"id": None, "config": {}, "summary": {}, "history": [], "finished": False}
    for raw in _wandb_records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["id"] = rec.run.run_id
            for item in rec.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                   for i in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                key = item.key or "/".join(item.nested_key)
                out["summary"][key] = json.loads(item.value_json)
        elif kind == "exit":
            out["finished"] = rec.exit.exit_code == 0
    # wandb stores config values as {"value": v}; unwrap them.
    out["config"] = {k: (v["value"] if isinstance(v, dict) and set(v) <= {"value", "desc"} and "value" in v else v)
                     for k, v in out["config"].items() if not k.startswith("_")}
    return out


def load_wandb_offline(root: str | Path) -> pd.DataFrame:
    """Runs from wandb offline folders (every ``run-*.wandb`` file under ``root``)."""
    root = Path(root)
    # wandb keeps a "latest-run" symlink to the newest run folder: count each file once.
    files = sorted({p.resolve() for p in root.rglob("run-*.wandb")})
    if not files:
        raise AnalysisError(f"no wandb run files (run-*.wandb) under {root}")
    newest, dropped = {}, []  # run id -> (row, file): a run id counts once, its newest file (files sort by start)
    for f in files:
        rec = read_wandb_file(f)
        rid = rec["id"] or f.stem.removeprefix("run-")
        summary = dict(rec["summary"])
        if rec["history"]:  # values logged last win where the summary lacks them
            last: dict = {}
            for h in rec["history"]:
                last.update(h)
            for k, v in last.items():
                summary.setdefault(k, v)
        # a quartet run (its mirror carries the derived config) logs final_val_loss once, when it completes: an
        # attempt that exited cleanly without it was preempted or stopped (exit code 0 too), and its last val_loss
        # is an interim one; the attempt that resumed it is another file under the same id
        state = "finished" if rec["finished"] else "running"
        if state == "finished" and _flat_get(rec["config"], "derived.n_params") is not None \
                and "final_val_loss" not in summary:
            state = "preempted"
        row, reason = _wandb_row(rid, state, summary, rec["config"], None)
        if reason:
            dropped.append({"run_id": rid, "reason": reason, "path": str(f)})
            continue
        row["source"] = "wandb-offline"
        if row["run_id"] in newest:
            dropped.append({"run_id": rid, "reason": "an older file of the same run id",
                            "path": newest[row["run_id"]][1]})
        newest[row["run_id"]] = (row, str(f))
    rows = [row for row, _ in newest.values()]
    if not rows:
        raise AnalysisError(f"no finished wandb runs under {root}: " + "; ".join(d["reason"] for d in dropped[:3]))
    return _finish(rows, dropped, {"kind": "wandb-offline", "path": str(root),
                                   "run_ids": sorted(r["run_id"] for r in rows)})


def load(source: str | Path) -> pd.DataFrame:
    """Dispatch on the source: ``paper``, ``wandb:entity/project``, a table file or a runs directory."""
    s = str(source)
    if s in ("paper", "--paper"):
        return load_paper()
    if s.startswith("wandb:"):
        return load_wandb(s)
    p = Path(s)
    if p.is_file():
        if p.suffix == ".wandb":
            return load_wandb_offline(p.parent)
        return load_table(p)
    if p.is_dir():
        if any(p.rglob("run-*.wandb")) and not any(p.rglob(paths.SUMMARY)):
            return load_wandb_offline(p)
        return load_runs_dir(p)
    if not p.exists():
        from quartet.paths import runs_root

        hint = ""
        if not p.is_absolute():  # the rule for where runs go: QUARTET_RUNS, else <checkout>/runs
            root = runs_root()
            under = root / (p.relative_to("runs") if p.parts[:1] == ("runs",) else p)
            hint = (f"; runs are under {root} (QUARTET_RUNS, else <checkout>/runs): quartet fit {under}"
                    if under.exists() else f" (relative to the working directory {Path.cwd()})")
        raise AnalysisError(f"{s} does not exist{hint} (give a runs directory, a .csv/.parquet table, --paper or "
                            f"wandb:ENTITY/PROJECT)")
    raise AnalysisError(f"source {s!r} is neither a runs directory, a .csv/.parquet table, 'paper' nor wandb:ENTITY/PROJECT")
