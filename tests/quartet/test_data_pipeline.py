"""Data pipeline: text -> shards -> batches round trip, document-level split, checksums, the sampler."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from quartet.config import compose, resolve
from quartet.data import WindowSampler, data_key, load, open_data, prepare, read_windows, val_windows
from quartet.errors import DataError

WORDS = "the quick brown fox jumps over a lazy dog while seven bold kings sing about winter and summer".split()


def _corpus(folder, n=60, seed=0):
    rng = random.Random(seed)
    folder.mkdir()
    docs = []
    for i in range(n):
        text = f"Document {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) + f" (end {i})\n"
        (folder / f"doc_{i:03d}.txt").write_text(text)
        docs.append(text)
    return docs


@pytest.fixture
def files_cfg(tmp_path):
    docs = _corpus(tmp_path / "corpus")
    cfg = compose(["data=files", f"data.paths=[{tmp_path / 'corpus'}]", "data.vocab_size=320", "data.val_fraction=0.2",
                   f"data.dir={tmp_path / 'prepared'}", "data.shard_tokens=1000", "model=llama_nano"])
    resolve(cfg)
    return cfg, docs


def _docs_of(data, split, tok, bos):
    text_docs = []
    for arr in getattr(data, split):
        ids = np.asarray(arr).tolist()
        text_docs.append(ids)
    ids = [i for shard in text_docs for i in shard]
    out, cur = [], None
    for i in ids:
        if i == bos:
            if cur is not None:
                out.append(tok.decode(cur))
            cur = []
        else:
            cur.append(i)
    out.append(tok.decode(cur))
    return out


def test_round_trip_text_to_shards_to_batches(files_cfg):
    cfg, docs = files_cfg
    folder = prepare(cfg.data, progress=False)
    man = json.loads((folder / "manifest.json").read_text())
    assert man["dtype"] == "uint16" and man["key"] == data_key(cfg.data)
    assert man["tokenizer"]["kind"] == "bpe" and man["tokenizer"]["vocab_size"] == 320
    train_shards = man["splits"]["train"]["shards"]
    assert len(train_shards) > 1 and all(s["tokens"] <= 1000 for s in train_shards)  # sharded
    assert man["splits"]["train"]["tokens"] == sum(s["tokens"] for s in train_shards)
    data = load(folder)
    tok = data.tokenizer()
    bos = tok.token_to_id("<|endoftext|>")
    assert bos == 0
    train_docs, val_docs = _docs_of(data, "train", tok, bos), _docs_of(data, "val", tok, bos)
    # byte-level BPE round-trips exactly; every document is in exactly one split; the union is the corpus
    assert len(train_docs) == man["splits"]["train"]["documents"] and len(val_docs) == man["splits"]["val"]["documents"]
    assert sorted(train_docs + val_docs) == sorted(docs)
    assert not set(train_docs) & set(val_docs)
    assert 4 <= len(val_docs) <= 24  # ~20% of 60
    # batches: shapes, targets shifted by one, ids in vocab
    sampler = WindowSampler(data.train, 16, seed=1)
    wins = sampler.take(8)
    x, y = read_windows(data.train, wins, 16)
    assert x.shape == y.shape == (8, 16) and str(x.dtype) == "torch.int64"
    assert (x[:, 1:] == y[:, :-1]).all()
    assert int(x.max()) < 320
    # the same config reuses the prepared folder (no rebuild)
    mtime = (folder / "manifest.json").stat().st_mtime_ns
    assert open_data(cfg.data, progress=False).folder == folder
    assert (folder / "manifest.json").stat().st_mtime_ns == mtime


def test_val_windows_cover_the_val_split(files_cfg):
    cfg, _ = files_cfg
    data = open_data(cfg.data, progress=False)
    w = val_windows(data.val, 16)
    assert len(w) == sum((len(s) - 1) // 16 for s in data.val)


def test_sampler_without_replacement_seeded_and_resumable(files_cfg):
    cfg, _ = files_cfg
    data = open_data(cfg.data, progress=False)
    s = WindowSampler(data.train, 16, seed=7)
    n = s.windows_per_epoch
    epoch0 = s.take(n)
    assert len({tuple(w) for w in epoch0}) == n  # no window twice within an epoch
    assert s.epoch == 1 and s.pos == 0
    epoch1 = s.take(n)
    assert not np.array_equal(epoch0, epoch1)  # new permutation (and offset) next epoch
    # seeded: same seed, same order; resume from a saved position gives the same continuation
    a = WindowSampler(data.train, 16, seed=7)
    a.take(5)
    state = a.state_dict()
    cont = a.take(n)
    b = WindowSampler(data.train, 16, seed=7)
    b.load_state_dict(state)
    assert np.array_equal(b.take(n), cont)
    assert not np.array_equal(WindowSampler(data.train, 16, seed=8).take(5), WindowSampler(data.train, 16, seed=7).take(5))
    # windows stay inside their shard with room for the target token
    for shard, start in epoch0:
        assert start + 16 + 1 <= len(data.train[shard])


def test_corrupt_missing_and_truncated_shards_are_detected(files_cfg):
    cfg, _ = files_cfg
    folder = prepare(cfg.data, progress=False)
    shard = folder / "train-00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="train-00001.bin fails its sha256 checksum"):
        load(folder)
    load(folder, verify="size")  # same size: only the checksum notices
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(DataError, match="train-00001.bin has .* bytes, the manifest says"):
        load(folder, verify="size")
    shard.unlink()
    with pytest.raises(DataError, match="train-00001.bin is missing"):
        open_data(cfg.data, progress=False)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json is corrupt"):
        load(folder)
    msg = ""
    try:
        load(folder)
    except DataError as exc:
        msg = str(exc)
    assert "\n" not in msg


def test_other_settings_in_the_same_folder_are_refused(files_cfg, tmp_path):
    cfg, _ = files_cfg
    prepare(cfg.data, progress=False)
    other = compose(["data=files", f"data.paths=[{tmp_path / 'corpus'}]", "data.vocab_size=400",
                     f"data.dir={tmp_path / 'prepared'}"])
    with pytest.raises(DataError, match="prepared with other settings"):
        open_data(other.data, progress=False)


def test_streamed_source_must_be_prepared_first(tmp_path):
    cfg = compose(["data=c4", f"data.dir={tmp_path / 'c4'}"])
    with pytest.raises(DataError, match="run `quartet data prepare data=c4`"):
        open_data(cfg.data, progress=False)


def test_bundled_corpus_prepares_with_scene_documents():
    cfg = compose(["data=shakespeare_small"])
    data = open_data(cfg.data, progress=False)
    man = data.manifest
    assert man["splits"]["train"]["documents"] > 50 and man["splits"]["val"]["documents"] >= 3
    assert man["source"]["source"] == "shakespeare"
