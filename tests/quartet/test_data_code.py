"""data.source=code: source files of local folders as documents (dedup, filters, content identity, progress)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sysconfig
from pathlib import Path

import pytest

from quartet.config import compose, resolve
from quartet.data import _Progress, code_roots, data_key, load, prepare, read_manifest, scan_code
from quartet.errors import ConfigError, DataError

NAMES = "alpha beta gamma delta total count index value result items table cache state scale".split()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Prepared data go under the test's tmp folder, never into the checkout's .cache."""
    monkeypatch.setenv("QUARTET_CACHE", str(tmp_path / "cache"))


def _module(rng: random.Random, i: int) -> str:
    lines = [f'"""Module {i}."""', "import math", ""]
    for j in range(rng.randint(3, 8)):
        a, b = rng.choice(NAMES), rng.choice(NAMES)
        lines += [f"def {a}_{j}_{i}({b}, {a}=None):", f"    {a} = {b} * {rng.randint(2, 99)} + math.sqrt({j})",
                  f"    return [{a} for {b} in range({rng.randint(1, 9)})]", ""]
    return "\n".join(lines) + "\n"


def _package(root: Path, n: int = 40, seed: int = 0) -> dict[str, bytes]:
    """n distinct modules in nested folders under root; returns {relative path: bytes}."""
    rng = random.Random(seed)
    files = {}
    for i in range(n):
        rel = Path(f"pkg_{i % 3}") / ("sub" if i % 2 else "") / ("deep" if i % 5 == 0 else "") / f"mod_{i:02d}.py"
        data = _module(rng, i).encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[str(rel)] = data
    return files


def _identity(contents) -> str:
    return hashlib.sha256("".join(d + "\n" for d in sorted({hashlib.sha256(c).hexdigest()
                                                              for c in contents})).encode()).hexdigest()


def _cfg(*overrides: str):
    cfg = compose(["data=pycode", "data.vocab_size=400", "data.val_fraction=0.1", "data.tokenizer_train_chars=null",
                   "model=llama_nano", *overrides])
    resolve(cfg)
    return cfg


def _shards(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.bin"))}


def test_duplicates_bad_files_and_other_extensions_are_skipped_and_counted(tmp_path):
    root = tmp_path / "src"
    files = _package(root)
    # the same file in two packages counts once; a .txt, a latin-1 file and a big file are left out
    shutil.copy(root / "pkg_0" / "deep" / "mod_00.py", root / "pkg_1" / "copy_of_mod_00.py")
    (root / "pkg_2" / "README.txt").write_text("not code\n")
    (root / "pkg_2" / "latin1.py").write_bytes("# caf\xe9 = 1\nx = 'd\xe9j\xe0'\n".encode("latin-1"))
    (root / "pkg_2" / "table.py").write_text("T = [" + "1, " * 3000 + "]\n")
    os.symlink(root, root / "pkg_0" / "loop")  # a symlinked folder is not entered (no cycle, no double count)
    cc = scan_code([str(root)], [".py"], max_file_bytes=4000)
    assert cc.info["files"] == len(files) == len(cc.texts)
    assert cc.info["skipped"] == {"duplicate": 1, "too_large": 1, "not_utf8": 1, "unreadable": 0}
    assert cc.info["bytes"] == sum(len(b) for b in files.values())
    assert cc.info["sha256"] == _identity(files.values())
    assert cc.info["roots"] == [str(root.resolve())] and cc.info["extensions"] == [".py"]
    assert sorted(cc.texts) == sorted(b.decode() for b in files.values())  # nested folders all found
    # documents are ordered by content hash, not by path
    digests = [hashlib.sha256(t.encode()).hexdigest() for t in cc.texts]
    assert digests == sorted(digests)
    # the extension filter: .txt files become documents only when asked for
    assert scan_code([str(root)], [".py", ".txt"], max_file_bytes=4000).info["files"] == len(files) + 1
    assert scan_code([str(root / "pkg_2" / "README.txt")], [".txt"]).texts == ["not code\n"]


def test_manifest_corpus_identity_follows_content_not_location(tmp_path):
    root = tmp_path / "src"
    files = _package(root)
    man = read_manifest(prepare(_cfg(f"data.paths=[{root}]").data, progress=False))
    corpus = man["corpus"]
    assert corpus["files"] == len(files) and corpus["bytes"] == sum(len(b) for b in files.values())
    assert corpus["sha256"] == _identity(files.values())
    assert corpus["skipped"]["duplicate"] == 0 and man["source"]["source"] == "code"
    assert man["splits"]["train"]["documents"] + man["splits"]["val"]["documents"] == len(files)
    # the same files under another root folder: same identity and the same token shards
    moved = tmp_path / "elsewhere" / "site-packages"
    shutil.copytree(root, moved)
    folder2 = prepare(_cfg(f"data.paths=[{moved}]").data, progress=False)
    man2 = read_manifest(folder2)
    assert man2["corpus"]["sha256"] == corpus["sha256"] and man2["corpus"]["roots"] == [str(moved.resolve())]
    assert man2["splits"] == man["splits"]
    # one file's content changes: another identity
    target = moved / "pkg_1" / "sub" / "mod_01.py"
    target.write_text(target.read_text() + "EXTRA = 1\n")
    man3 = read_manifest(prepare(_cfg(f"data.paths=[{moved}]").data, force=True, progress=False))
    assert man3["corpus"]["sha256"] != corpus["sha256"] and man3["corpus"]["files"] == len(files)


def test_prepare_is_deterministic_across_caches(tmp_path, monkeypatch):
    root = tmp_path / "src"
    _package(root)
    cfg = _cfg(f"data.paths=[{root}]", "data.shard_tokens=3000")
    folders = []
    for cache in ("cache_a", "cache_b"):
        monkeypatch.setenv("QUARTET_CACHE", str(tmp_path / cache))
        folders.append(prepare(cfg.data, progress=False))
    assert folders[0] != folders[1] and str(tmp_path / "cache_b") in str(folders[1])
    a, b = _shards(folders[0]), _shards(folders[1])
    assert len(a) > 2 and a == b
    assert (folders[0] / "tokenizer.json").read_bytes() == (folders[1] / "tokenizer.json").read_bytes()


def test_tokenizer_train_chars_bounds_what_the_bpe_sees(tmp_path):
    root = tmp_path / "src"
    _package(root)
    full = _cfg(f"data.paths=[{root}]", "data.vocab_size=1024")
    small = _cfg(f"data.paths=[{root}]", "data.vocab_size=1024", "data.tokenizer_train_chars=10")
    assert data_key(full.data) != data_key(small.data)  # it changes the token stream
    man_full = load(prepare(full.data, progress=False)).manifest
    data = load(prepare(small.data, progress=False))  # verify=full: sizes and checksums of the shards
    man = data.manifest
    assert man["tokenizer"]["train_documents"] == 1  # whole documents, at least one
    assert man["tokenizer"]["train_chars"] < man_full["tokenizer"]["train_chars"]
    assert man_full["tokenizer"]["train_documents"] == man_full["splits"]["train"]["documents"]
    # fewer learned merges, so more tokens for the same (fully encoded) documents
    assert man["tokenizer"]["trained_vocab_size"] < man_full["tokenizer"]["trained_vocab_size"]
    assert man["splits"]["train"]["documents"] == man_full["splits"]["train"]["documents"]
    assert man["splits"]["train"]["tokens"] > man_full["splits"]["train"]["tokens"]
    assert max(int(s.max()) for s in data.train) < man["tokenizer"]["trained_vocab_size"]


def test_progress_lines_off_a_terminal(tmp_path, capsys):
    root = tmp_path / "src"
    _package(root, n=20)
    prepare(_cfg(f"data.paths=[{root}]", "data.tokenizer_train_chars=5000").data, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err  # no bar frames in a log file
    lines = err.splitlines()
    assert any(ln.startswith("scanning roots: 20 files found, 20 kept") for ln in lines), err
    assert any(ln.startswith("training BPE: ") and " chars of " in ln for ln in lines), err
    assert any(ln.startswith("tokenizing pycode: 100% (20/20 docs, ") for ln in lines), err
    prepare(_cfg(f"data.paths=[{root}]", "data.vocab_size=300").data, progress=False)
    assert capsys.readouterr().err == ""
    # about one line per 10% of the documents
    with _Progress(100, "tokenizing x", True) as bar:
        for _ in range(20):
            bar.update(5, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10 and lines[3].startswith("tokenizing x: 40% (40/100 docs, 0.0M tokens, ")


def test_roots_default_to_this_interpreters_libraries_and_bad_input_is_one_line(tmp_path):
    roots = code_roots([])
    assert roots and all(r.is_dir() for r in roots) and len(set(roots)) == len(roots)
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in roots
    assert code_roots([str(tmp_path), str(tmp_path / ".")]) == [tmp_path.resolve()]
    with pytest.raises(DataError, match=r"data.paths: .*missing does not exist"):
        code_roots([str(tmp_path / "missing")])
    (tmp_path / "notes.txt").write_text("x\n")
    with pytest.raises(DataError, match=r"no file ending with \.py under") as info:
        scan_code([str(tmp_path)], [".py"])
    assert "\n" not in str(info.value)


def test_pycode_config_composes_and_validates():
    cfg = compose(["data=pycode"])
    res = resolve(cfg)
    d = cfg.data
    assert d.source == "code" and list(d.paths) == [] and list(d.extensions) == [".py"]
    assert d.vocab_size == 4096 and d.tokenizer_train_chars == 40_000_000 and d.max_file_bytes == 1_000_000
    assert res.token_dtype == "uint16"
    for bad, msg in ((["data.extensions=[]"], "data.extensions=.*needs at least one"),
                     (["data.max_file_bytes=0"], "data.max_file_bytes=0: must be a positive integer"),
                     (["data.tokenizer_train_chars=0"], "data.tokenizer_train_chars=0: must be")):
        with pytest.raises(ConfigError, match=msg):
            resolve(compose(["data=pycode", *bad]))
    # the code-only keys leave the keys of other sources (their prepared folders) as they were
    base = compose(["data=shakespeare_small"]).data
    assert data_key(compose(["data=shakespeare_small", "data.extensions=[.md]"]).data) == data_key(base)
    assert data_key(compose(["data=pycode", "data.extensions=[.py,.pyi]"]).data) != data_key(d)
    assert json.dumps(list(d.extensions)) == '[".py"]'
