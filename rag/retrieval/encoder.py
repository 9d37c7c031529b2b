"""The encoder as ingest and retrieval use it: length-sorted, token-budgeted batches, L2-normalised
float32 output, the model's query/document prompts, optional bf16 and int8 paths, and an identity
(name, dimension, weights fingerprint) that indexes record.

Why our own batching over ``SentenceTransformer.encode`` alone: encode sorts by character length
with a fixed batch size; sorting by token count and sizing batches by a token budget wastes less
padding on the mixed chunk lengths of a real corpus and lets short texts go in larger batches.
The forward pass itself is still sentence-transformers' (``encode_document`` / ``encode_query``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.documents.chunking import count_tokens, special_tokens, token_offsets
from rag.models.precision import (
    check_precision,
    encoder_auto_precision,
    quantize_dynamic_int8,
    to_bf16,
)

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

# torch: sentence-transformers as loaded; onnx: its transformer run by ONNX Runtime from a cached
# export (rag.retrieval.onnx_encoder), same embeddings within float tolerance, int8 with --precision int8
ENCODER_BACKENDS = ("torch", "onnx")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".onnx")


class EncoderMismatchError(ValueError):
    """An index built with one encoder used with another; the message names both."""


def weights_fingerprint(folder: str | Path) -> str:
    """sha256 (first 16 hex digits) over the weight files' names, sizes and bytes."""
    folder = Path(folder)
    h = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    for p in files:
        h.update(f"{p.relative_to(folder)}:{p.stat().st_size}".encode())
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def state_fingerprint(model: Any) -> str:
    """Fingerprint of an in-memory model's parameters (when it has no folder)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def check_backend(backend: str, device: str = "auto", precision: str = "auto") -> None:
    """Refuse unknown backends, ONNX on a GPU (only the CPU provider is wired and tested), and
    ONNX in bf16 (onnxruntime's CPU provider has no bf16 kernels for these graphs)."""
    if backend not in ENCODER_BACKENDS:
        raise ValueError(
            f"--encoder-backend must be one of {', '.join(ENCODER_BACKENDS)}, not {backend!r}"
        )
    if backend == "onnx" and device == "cuda":
        raise ValueError("--encoder-backend onnx runs on CPU only; use --device cpu or auto")
    if backend == "onnx" and precision == "bf16":
        raise ValueError(
            "--precision bf16 runs on --encoder-backend torch only (onnx: fp32 or int8)"
        )


class Encoder:
    """A SentenceTransformer plus how we batch it and who it is.

    ``precision``: :mod:`rag.models.precision` (``auto`` is resolved for the model's device by
    :func:`rag.models.precision.encoder_auto_precision`: bf16 on CUDA, and on a CPU only where a cached
    probe measured it faster; :attr:`precision` and the index's manifest record what ran). ``batch_tokens`` bounds padded tokens per batch (batch size x longest text), ``max_batch``
    bounds texts per batch.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        name: str = "",
        path: str | Path | None = None,
        precision: str = "auto",
        batch_tokens: int = 8192,
        max_batch: int = 128,
        backend: str = "torch",
    ):
        self.auto_reason = ""  # why precision auto chose what it did (the ingest report says)
        if check_precision(precision) == "auto":  # ONNX has no bf16 kernels
            device = getattr(getattr(model, "device", None), "type", "cpu")
            precision, self.auto_reason = (
                ("fp32", "the onnx backend")
                if backend == "onnx"
                else encoder_auto_precision(device)  # bf16 only where measured faster
            )
        check_backend(backend, precision=precision)
        self.model = model
        self.name = name or (str(path) if path else type(model).__name__)
        self.path = Path(path) if path else None
        self.precision, self.backend = precision, backend
        self.batch_tokens, self.max_batch = batch_tokens, max_batch
        self._fingerprint: str | None = None
        if backend == "onnx":  # the export is keyed by the torch weights' fingerprint
            from rag.retrieval.onnx_encoder import use_onnx

            self.model = use_onnx(model, self.fingerprint, precision)
        elif precision == "int8":
            self.model = quantize_dynamic_int8(model)
        elif precision == "bf16":
            self.model = to_bf16(model)

    @classmethod
    def load(
        cls,
        name: str | Path,
        device: str = "auto",
        precision: str = "auto",
        backend: str = "torch",
        **kw: Any,
    ) -> Encoder:
        """Load an alias, SentenceTransformer folder or plain HF encoder folder. ``backend``
        ``onnx`` runs on CPU, so ``auto`` means CPU there (ONNX Runtime is given only its CPU
        provider)."""
        from rag.models import load_embedder, resolve_model

        check_backend(backend, device, precision)
        path = resolve_model(name)
        model = load_embedder(path, device="cpu" if backend == "onnx" else device)
        return cls(model, name=str(name), path=path, precision=precision, backend=backend, **kw)

    @classmethod
    def wrap(
        cls, model: SentenceTransformer | str | Path | Encoder, device: str = "auto"
    ) -> Encoder:
        """An Encoder from a model object (its weights used as they are), a name (loaded in
        the ``auto`` precision), or an Encoder (returned as is)."""
        if isinstance(model, Encoder):
            return model
        if isinstance(model, (str, Path)):
            return cls.load(model, device=device)
        return cls(model, precision="fp32")  # no cast: the caller's object stays as it is

    # ------------------------------------------------------------------ identity

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def max_chunk_tokens(self) -> int:
        """Longest text (in tokens, without special tokens) the encoder reads without truncation."""
        return int(self.model.max_seq_length) - special_tokens(self.tokenizer)

    @property
    def query_prompt(self) -> str:
        return self.model.prompts.get("query") or ""

    @property
    def document_prompt(self) -> str:
        for key in ("document", "passage", "corpus"):
            if self.model.prompts.get(key):
                return self.model.prompts[key]
        return ""

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            has_files = self.path is not None and any(
                p.suffix in WEIGHT_SUFFIXES for p in self.path.rglob("*")
            )
            self._fingerprint = (
                weights_fingerprint(self.path) if has_files else state_fingerprint(self.model)
            )
        return self._fingerprint

    def identity(self) -> dict[str, Any]:
        """What an index records about the encoder that built it."""
        return {
            "name": self.name,
            "path": str(self.path) if self.path else None,
            "dim": self.dim,
            "fingerprint": self.fingerprint,
            "max_seq_length": int(self.model.max_seq_length),
            "precision": self.precision,
            "backend": self.backend,  # informational: check_matches ignores it (same function)
        }

    def check_matches(self, recorded: dict[str, Any], index_name: str) -> None:
        """Raise :class:`EncoderMismatchError` naming both encoders unless ``recorded`` (from an
        index manifest) is this encoder: same dimension and weights fingerprint."""
        if recorded.get("dim") == self.dim and recorded.get("fingerprint") == self.fingerprint:
            return
        raise EncoderMismatchError(
            f"index {index_name!r} was built with encoder {recorded.get('name')!r} "
            f"(dim {recorded.get('dim')}, weights {recorded.get('fingerprint')}), "
            f"not with {self.name!r} (dim {self.dim}, weights {self.fingerprint}); "
            f"use --encoder {recorded.get('name')} or ingest into a new --index"
        )

    # ------------------------------------------------------------------ encoding

    def batches(self, texts: list[str], batch_tokens: int | None = None) -> list[list[int]]:
        """Indices of ``texts`` grouped into batches of similar token length (longest first),
        each at most ``batch_tokens`` padded tokens (default :attr:`batch_tokens`)."""
        limit = batch_tokens or self.batch_tokens
        cap = int(self.model.max_seq_length)
        lengths = [min(n + 2, cap) for n in count_tokens(self.tokenizer, texts)]
        order = sorted(range(len(texts)), key=lambda i: -lengths[i])
        out: list[list[int]] = []
        for i in order:
            if (
                out
                and len(out[-1]) < self.max_batch
                and lengths[out[-1][0]] * (len(out[-1]) + 1) <= limit
            ):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def encode(
        self,
        texts: list[str],
        kind: str = "document",
        progress: bool = False,
        on_batch: Callable[[int], None] | None = None,
        batch_tokens: int | None = None,
    ) -> np.ndarray:
        """L2-normalised float32 embeddings, shape (len(texts), dim), in input order.
        ``kind`` selects the model's document or query prompt; ``on_batch(n)`` is called after
        each batch of ``n`` texts; ``progress`` shows a bar on a terminal, else a line at a
        steady interval (:mod:`rag.cli.progress`); ``batch_tokens`` overrides :attr:`batch_tokens`
        (texts of mixed lengths, such as sentences, pad less in smaller batches). Identical
        texts are embedded once: a file of 1,000,000 bare ``# h`` headings is 7,875 chunks of two
        distinct texts, 196 s of embedding when each was read."""
        import torch

        from rag.cli.progress import Progress

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        unique = list(dict.fromkeys(texts))
        if len(unique) < len(texts):
            vecs = self.encode(unique, kind, progress, on_batch, batch_tokens)
            row = {t: i for i, t in enumerate(unique)}
            return vecs[[row[t] for t in texts]]
        fn = self.model.encode_query if kind == "query" else self.model.encode_document
        bar = Progress(len(texts), "encode", "chunk", enabled=progress)
        with torch.inference_mode():
            for batch in self.batches(texts, batch_tokens):
                vecs = fn(
                    [texts[i] for i in batch],
                    batch_size=len(batch),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                out[batch] = vecs
                bar.update(len(batch))
                if on_batch is not None:
                    on_batch(len(batch))
        bar.close()
        if self.precision == "bf16":  # normalised in bf16 (norms 1 +- 4e-3): redo it in fp32
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    @property
    def reads_in_context(self) -> bool:
        """Whether :meth:`encode_spans` can pool a span's tokens out of its whole text: the
        torch backend, a fast tokenizer (character offsets), mean pooling, no document prompt
        (which would shift the offsets)."""
        pooling = next((m for m in self.model if type(m).__name__ == "Pooling"), None)
        mode = pooling.get_config_dict().get("pooling_mode") if pooling is not None else None
        return (
            self.backend == "torch"
            and mode == "mean"
            and bool(getattr(self.tokenizer, "is_fast", False))
            and not self.document_prompt
        )

    def encode_spans(
        self,
        texts: list[str],
        spans: list[list[tuple[int, int]]],
        batch_tokens: int | None = None,
    ) -> list[list[np.ndarray | None]]:
        """Late-chunked vectors: each text goes through the encoder once, and each span
        ``(start, end)`` (character offsets into its text) gets the mean of the token states
        whose characters lie in it, L2-normalised: the model's own mean pooling, over the
        span's tokens instead of the whole text's. None for a span of which the encoder read no
        token (past ``max_seq_length``); a text with no span is not read. Needs
        :attr:`reads_in_context`.

        Why: a sentence embedded alone loses what its passage says around it ("It was founded
        in 1850" does not name what was founded); read inside its passage, with bidirectional
        attention over all of it, its tokens carry that context. sentence-transformers returns
        the token states (``output_value="token_embeddings"``) but pools only whole texts, so
        the pooling over spans is ours. Measured in docs/answering.md."""
        import torch

        if not self.reads_in_context:
            raise ValueError(f"encoder {self.name!r} cannot pool spans in context")
        out: list[list[np.ndarray | None]] = [[None] * len(s) for s in spans]
        wanted = [i for i, s in enumerate(spans) if s]  # a text with no span is not read
        with torch.inference_mode():
            for group in self.batches([texts[i] for i in wanted], batch_tokens):
                batch = [wanted[g] for g in group]
                chunk = [texts[i] for i in batch]
                states = self.model.encode_document(
                    chunk, batch_size=len(batch), output_value="token_embeddings"
                )
                for i, tokens, off in zip(batch, states, token_offsets(self.tokenizer, chunk)):
                    if len(off) > len(tokens):  # cut at max_seq_length: the first n - 1 and the end
                        off = off[: len(tokens) - 1] + [(0, 0)]
                    if len(off) != len(tokens):  # tokenised differently: leave these spans alone
                        continue
                    starts = np.array([a for a, _ in off])
                    ends = np.array([b for _, b in off])
                    real = ends > starts  # special tokens have (0, 0)
                    vecs = tokens.float().cpu().numpy()
                    for j, (start, end) in enumerate(spans[i]):
                        inside = real & (ends > start) & (starts < end)
                        if inside.any():
                            v = vecs[inside].mean(axis=0)
                            out[i][j] = v / max(float(np.linalg.norm(v)), 1e-12)
        return out

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode(queries, kind="query")
