"""Corpus → packed token windows, with a file-level train / held-out split fixed by seed.

Every document becomes ``<s> tokens </s>`` and all documents are concatenated into one stream
per split; the stream is cut into windows of ``seq_len`` tokens (packing: no padding at all).
Batch ``k`` of the run is a pure function of (seed, k): windows are visited in a seeded
permutation per epoch, so the data position is just the step number and a resumed run reads
exactly the batches an uninterrupted one would. Tokenised streams are cached under
``$RAG_HOME/cache`` keyed by tokenizer, files and split, so the MLM and CLM runs of
``make models`` (and resumes) tokenise once.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rag.documents import DocumentError, iter_files, load_document
from rag.storage.paths import cache_dir


class CorpusError(ValueError):
    """The corpus cannot be used (empty, unreadable, too small to split)."""


@dataclass
class Split:
    """One side of the split: the token stream and how many UTF-8 bytes of text it encodes."""

    ids: np.ndarray  # int32 token stream, documents wrapped in <s> ... </s>
    n_bytes: int  # UTF-8 bytes of the documents' text
    files: list[str]

    @property
    def tokens_per_byte(self) -> float:
        return len(self.ids) / max(1, self.n_bytes)


def list_files(corpus: list[str]) -> list[Path]:
    """Supported files under the corpus paths; a missing path is an error naming it."""
    files: list[Path] = []
    for item in iter_files(corpus):
        if isinstance(item, DocumentError):
            if "no such file" in item.reason:
                raise CorpusError(f"--corpus {item.path}: no such file or directory")
            continue
        files.append(item)
    if not files:
        raise CorpusError(f"--corpus {' '.join(corpus)}: no .txt/.md/.rst/.html documents found")
    return files


def split_files(
    files: list[Path], heldout_fraction: float, seed: int
) -> tuple[list[Path], list[Path]]:
    """Seeded file-level split; at least one file on each side."""
    if len(files) < 2:
        raise CorpusError(
            f"the corpus has {len(files)} file; a train/held-out split needs at least 2"
        )
    order = sorted(files, key=str)
    random.Random(seed).shuffle(order)
    n_held = min(len(order) - 1, max(1, round(heldout_fraction * len(order))))
    return order[n_held:], order[:n_held]


def encode_files(files: list[Path], tokenizer, desc: str = "") -> Split:
    """Load and tokenise files into one stream (unreadable files are skipped with a note)."""
    backend = tokenizer.backend_tokenizer
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    texts, kept = [], []
    for f in files:
        try:
            texts.append(load_document(f).text)
            kept.append(str(f))
        except DocumentError as e:
            print(f"skipped {e}", file=sys.stderr)
    chunks, n_bytes = [], 0
    for start in range(0, len(texts), 256):
        batch = texts[start : start + 256]
        for text, enc in zip(
            batch, backend.encode_batch(batch, add_special_tokens=False), strict=True
        ):
            chunks.append(np.asarray([bos, *enc.ids, eos], dtype=np.int32))
            n_bytes += len(text.encode("utf-8"))
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    return Split(ids=ids, n_bytes=n_bytes, files=kept)


def _cache_key(files: list[Path], tokenizer, heldout_fraction: float, seed: int) -> str:
    h = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    h.update(f"{heldout_fraction}:{seed}".encode())
    for f in sorted(files, key=str):
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def load_corpus(
    corpus: list[str], tokenizer, heldout_fraction: float, seed: int, cache: bool = True
) -> tuple[Split, Split]:
    """(train, held-out) token streams for the corpus, from the cache when possible."""
    files = list_files(corpus)
    key = _cache_key(files, tokenizer, heldout_fraction, seed)
    path = cache_dir() / f"corpus-{key}.npz"
    if cache and path.exists():
        z = np.load(path)
        meta = json.loads(str(z["meta"]))
        return (
            Split(z["train"], meta["train_bytes"], meta["train_files"]),
            Split(z["heldout"], meta["heldout_bytes"], meta["heldout_files"]),
        )
    train_files, held_files = split_files(files, heldout_fraction, seed)
    train, held = encode_files(train_files, tokenizer), encode_files(held_files, tokenizer)
    if len(train.ids) == 0 or len(held.ids) == 0:
        raise CorpusError(f"--corpus {' '.join(corpus)}: no readable text on one side of the split")
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(train_bytes=train.n_bytes, heldout_bytes=held.n_bytes)
        meta.update(train_files=train.files, heldout_files=held.files)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")  # torchrun ranks race here
        np.savez(tmp, train=train.ids, heldout=held.ids, meta=np.array(json.dumps(meta)))
        tmp.replace(path)
    return train, held


class PackedBatches:
    """Batch ``k`` = ``batch_size`` windows of ``seq_len`` tokens from a seeded per-epoch
    permutation. With several processes, process ``rank`` takes its own slice of each global
    batch, so data parallelism needs no sampler and no code change."""

    def __init__(
        self,
        ids: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
    ):
        n = len(ids) // seq_len
        if n < 1:
            raise CorpusError(
                f"the training stream ({len(ids)} tokens) is shorter than --seq-len {seq_len}"
            )
        self.windows = torch.from_numpy(ids[: n * seq_len].astype(np.int64)).view(n, seq_len)
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self._perm_epoch, self._perm = -1, None

    def __len__(self) -> int:
        return len(self.windows)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.windows), generator=g), epoch
        return self._perm

    def batch(self, step: int) -> torch.Tensor:
        """Windows for optimizer step ``step`` (0-based) on this process."""
        n = len(self.windows)
        start = (step * self.world + self.rank) * self.batch_size
        idx = []
        for pos in range(start, start + self.batch_size):
            idx.append(self._permutation(pos // n)[pos % n])
        return self.windows[torch.stack(idx)]

    def epoch_of(self, step: int) -> float:
        return (step + 1) * self.world * self.batch_size / len(self.windows)


def eval_windows(ids: np.ndarray, seq_len: int, max_windows: int) -> torch.Tensor:
    """Held-out windows spread evenly over the held-out stream (fixed for the whole run)."""
    n = len(ids) // seq_len
    if n < 1:
        raise CorpusError(
            f"the held-out stream ({len(ids)} tokens) is shorter than --seq-len {seq_len}"
        )
    windows = torch.from_numpy(ids[: n * seq_len].astype(np.int64)).view(n, seq_len)
    if n <= max_windows:
        return windows
    pick = torch.linspace(0, n - 1, max_windows).round().long()
    return windows[pick]


def unigram_bits_per_byte(train: Split, held: Split, vocab_size: int) -> float:
    """Bits per byte of an add-one-smoothed unigram model fitted on the training stream and
    scored on the held-out stream: the baseline a pretrained model must beat by far."""
    counts = np.bincount(train.ids, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    nats = -logp[held.ids].sum()
    return float(nats / (held.n_bytes * math.log(2)))
