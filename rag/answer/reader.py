"""The extractive reader: an encoder with a span head finds the answer inside the passages.

The bidirectional encoder reads (question, passage) together and gives every passage token a
start and an end logit; an answer is the span ``i..j`` with the largest ``start[i] + end[j]``
(``j - i < max_answer_tokens``, inside the passage), and the ``[CLS]`` position carries the
*null* score ("not in this passage", the SQuAD 2.0 recipe). Long passages are read in stride
windows as transformers' question-answering recipe does.

Scores are made comparable across windows and passages by using the **margin** ``span - null``
of the window a span came from: a window's logits share one offset, which the difference
cancels, so the best margin over all windows of all passages picks the answer; a best margin
below ``threshold`` means the reader abstains (the pipeline then falls back to the decoder over
all passages, or refuses when the answerability check agrees).

Why hand-written around the model: transformers' ``pipeline("question-answering")`` decodes one
context at a time and reports a softmax probability per window that is not comparable across
passages; the pure :func:`best_span` below is the same search over logits, with the null score
kept, and ``tests`` check it gives the pipeline's span on a single passage.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Span:
    """The reader's best answer inside one passage."""

    passage: int  # index of the passage in the list given to :meth:`SpanReader.read`
    start: int  # character offset of the span in that passage
    end: int  # character offset one past the span's last character
    text: str  # passage[start:end]
    score: float  # start + end logit of the span
    null_score: float  # start + end logit of [CLS] in the window the span came from

    @property
    def margin(self) -> float:
        """``score - null_score``: > 0 when the reader prefers the span to "no answer"."""
        return self.score - self.null_score


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    context: np.ndarray,
    max_answer_tokens: int = 30,
) -> tuple[int, int, float] | None:
    """The best (start token, end token, score) of one window, or None when no passage token is
    in it. ``context`` is a bool mask of the tokens that belong to the passage; a span must lie
    inside it, end at or after its start and be at most ``max_answer_tokens`` long."""
    idx = np.flatnonzero(context)
    if idx.size == 0:
        return None
    s = start_logits[idx]  # (n,)
    e = end_logits[idx]  # (n,)
    scores = s[:, None] + e[None, :]  # (n, n): start i, end j
    pos = idx[:, None], idx[None, :]
    width = pos[1] - pos[0]
    scores = np.where((width >= 0) & (width < max_answer_tokens), scores, -np.inf)
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return int(idx[i]), int(idx[j]), float(scores[i, j])


def pick(spans: Sequence[Span], threshold: float) -> Span | None:
    """The span with the best margin over all passages, or None when even that margin is below
    ``threshold`` (every passage says "not here")."""
    if not spans:
        return None
    top = max(spans, key=lambda s: s.margin)
    return top if top.margin >= threshold else None


class SpanReader:
    """An ``AutoModelForQuestionAnswering`` folder read over several passages at once."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_length: int = 384,
        stride: int = 128,
        max_answer_tokens: int = 30,
        batch_size: int = 16,
        threshold: float = 0.0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.stride = stride
        self.max_answer_tokens = max_answer_tokens
        self.batch_size = batch_size
        # the null threshold its training chose (reader.json); 0.0 = "prefer the span whenever
        # its margin is positive" for a folder without one
        self.threshold = threshold
        self._lock = threading.Lock()

    def threshold_for(self, given: float | None) -> float:
        """The margin a span must beat: ``given`` (``--reader-threshold``), else the one this
        reader's training chose (its reader.json; 0.0 for a folder without one)."""
        return self.threshold if given is None else given

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", precision: str = "auto") -> SpanReader:
        """Load a reader folder (``training.finetune.reader`` writes them; any HF QA model works).
        ``precision`` (:mod:`rag.models.precision`): ``auto`` = bf16 where it runs fast on
        ``device``, else fp32; ``bf16`` casts the weights (the logits are compared in fp32); the
        reader has no int8 weights (``int8`` reads in the ``auto`` float precision)."""
        import torch
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        from rag.models.precision import check_precision, float_precision

        precision = float_precision(check_precision(precision), device)

        path = Path(path)
        tok = AutoTokenizer.from_pretrained(str(path))
        if not getattr(tok, "is_fast", False):
            raise ValueError(f"{path}: the reader needs a fast tokenizer (character offsets)")
        model = AutoModelForQuestionAnswering.from_pretrained(str(path))
        if precision == "bf16":
            model = model.to(torch.bfloat16)
        model.to(device).eval()
        settings = {"max_length": 384, **_reader_settings(path)}
        positions = getattr(model.config, "max_position_embeddings", None)
        if positions:  # never a window longer than the model has positions for
            settings["max_length"] = min(settings["max_length"], positions)
        return cls(model, tok, **settings)

    def read(self, question: str, passages: Sequence[str]) -> list[Span]:
        """The best span of each passage that has one (windows of a long passage compete by
        margin), in passage order."""
        import torch

        if not passages:
            return []
        enc = self.tokenizer(
            [question] * len(passages),
            list(passages),
            truncation="only_second",
            max_length=self.max_length,
            stride=self.stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding=True,
            return_tensors="pt",
        )
        owner = enc.pop("overflow_to_sample_mapping").tolist()  # window -> passage
        offsets = enc.pop("offset_mapping").numpy()  # (windows, T, 2)
        context = np.array(
            [[sid == 1 for sid in enc.sequence_ids(w)] for w in range(len(owner))]
        )  # (windows, T)
        device = next(self.model.parameters()).device
        starts, ends = [], []
        with self._lock, torch.inference_mode():
            for b in range(0, len(owner), self.batch_size):
                batch = {k: v[b : b + self.batch_size].to(device) for k, v in enc.items()}
                out = self.model(**batch)
                starts.append(out.start_logits.float().cpu().numpy())
                ends.append(out.end_logits.float().cpu().numpy())
        start_logits, end_logits = np.concatenate(starts), np.concatenate(ends)  # (windows, T)
        best: dict[int, Span] = {}
        for w, p in enumerate(owner):
            found = best_span(start_logits[w], end_logits[w], context[w], self.max_answer_tokens)
            if found is None:
                continue
            i, j, score = found
            null = float(start_logits[w, 0] + end_logits[w, 0])
            a, z = int(offsets[w, i, 0]), int(offsets[w, j, 1])
            span = Span(p, a, z, passages[p][a:z], score, null)
            if p not in best or span.margin > best[p].margin:
                best[p] = span
        return [best[p] for p in sorted(best)]


def _reader_settings(path: Path) -> dict[str, Any]:
    """max_length / stride / max_answer_tokens / threshold saved in ``reader.json`` by the
    training run (none for a folder without one)."""
    import json

    f = path / "reader.json"
    if not f.is_file():
        return {}
    saved = json.loads(f.read_text())
    keys = ("max_length", "stride", "max_answer_tokens", "threshold")
    out = {k: saved[k] for k in keys if k in saved}
    if "threshold" in out:
        out["threshold"] = check_reader_threshold(out["threshold"], str(f))
    return out


def check_reader_threshold(value: Any, where: str) -> float:
    """``value`` as a reader threshold (a margin in logits: any finite number), else a one-line
    error naming ``where`` (the flag, or the reader.json that holds it)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: the reader threshold must be a finite number, not {value!r}")
    return float(value)


# ---------------------------------------------------------------------------- product wiring

READER_ARTEFACT = "minilm-reader"  # what `make models` trains (training.finetune.reader)
DEFAULT_READER = "auto"
COMPOSE = ("decoder", "extract")  # who writes the answer around the span (RAGConfig.compose)
_SENTENCE_END = ".!?\n"


def resolve_reader(name: str | None) -> Path | None:
    """The reader folder for ``--reader``: ``auto`` = ``$RAG_HOME/models/minilm-reader`` when
    `make models` trained it, else None (no reader stage); ``none`` = None; else a folder or an
    artefact name under ``$RAG_HOME/models`` (a missing one is an error naming the flag)."""
    from rag.storage.paths import models_dir

    if name is None or name == "none":
        return None
    if name == "auto":
        path = models_dir() / READER_ARTEFACT
        return path if (path / "reader.json").is_file() else None
    for path in (Path(name), models_dir() / name):
        if (path / "config.json").is_file():
            return path
    raise FileNotFoundError(
        f"--reader {name}: no such reader folder or artefact under {models_dir()} "
        "(train one with `python -m training.finetune.reader`, or use --reader none)"
    )


def sentence_around(text: str, start: int, end: int) -> str:
    """The sentence(s) of ``text`` that hold ``text[start:end]``: from the previous sentence end
    to the next one (the answer the reader alone gives, with no decoder)."""
    a = max((text.rfind(c, 0, start) for c in _SENTENCE_END), default=-1) + 1
    stops = [i for c in _SENTENCE_END if (i := text.find(c, end)) >= 0]
    z = min(stops) + 1 if stops else len(text)
    return text[a:z].strip()


def describe_reader(setting: str | None) -> str:
    """One line for people: which reader finds the short answer, whether ``auto`` chose it, or
    that the decoder answers alone (and how to get one)."""
    path = resolve_reader(setting)
    if path is None:
        if setting == "auto":
            return f"off (auto: no {READER_ARTEFACT} trained yet: `make models`)"
        return "off"
    return f"{path.name} (auto)" if setting == "auto" else path.name
