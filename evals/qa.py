"""Grounded QA evaluation on SQuAD: EM/F1, citation accuracy, refusal rate and latency.

Two modes, both with the project's prompt format (:mod:`rag.prompt`) and generator
(:class:`rag.generate.generator.Generator`):

- ``oracle``: the generator sees the question's gold paragraph among ``k - 1`` BM25-retrieved
  distractor paragraphs of the same file, in a seeded random order. This isolates the reader.
- ``rag``: the full retrieve-then-answer path: ``rag.retrieval.retriever.CorpusRetriever`` over every
  paragraph of the file (title + text), top ``k`` passages to the generator.

A citation is correct when the answer cites at least one passage and every cited passage holds
the answer (the gold paragraph, or any passage containing a gold answer string). Citation
accuracy is over the questions whose passages hold the answer; refusal rate over all questions.
Questions come from the held-out articles (:data:`rag.evaluation.datasets.SQUAD_DEV_ARTICLES`) unless
``--articles`` says otherwise; ``--limit`` takes a seeded sample across those articles.

Refusals (rag mode): ``--removed-articles N`` takes N of those articles (seeded) out of the index
and asks up to ``--unanswerable-limit`` of their questions: the right answer is then the refusal.
``refusal_rate_unanswerable`` is measured on them, ``false_refusal_rate`` on the answerable
questions whose retrieved passages hold the answer; EM/F1/citation accuracy on answerable ones.

CLI::

    python -m evals.qa --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --generator smollm2 --mode oracle --k 3 --limit 100 --out qa.json
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rag.answer.answerability import DEFAULT_MODEL
from rag.dataclass_cli import config_parser, run_config_cli
from rag.defaults import DEFAULT_EVIDENCE_PASSAGES, DEFAULT_EVIDENCE_TOKENS
from rag.evaluation.datasets import DatasetError, SquadParagraph, load_squad_paragraphs, squad_split
from rag.evaluation.metrics import citation_correct, exact_match, f1_score, normalize_answer
from rag.progress import track
from rag.prompt import build_messages, parse_citations
from rag.retrieval.embedding_cache import EmbeddingCache, cache_stats


@dataclass
class QAEvalConfig:
    """One QA evaluation; every field is written to the output JSON."""

    squad: str = ""  # SQuAD v1.1 JSON file
    articles: list[str] = field(default_factory=list)  # article titles; empty = --split's articles
    split: str = "dev"  # dev (held-out articles: report here) | train (tune thresholds here)
    generator: str = "smollm2"  # causal LM alias or folder
    adapter: str | None = None  # optional LoRA adapter folder
    mode: str = "oracle"  # oracle (gold among BM25 distractors) | rag (retrieve, all paragraphs)
    retriever: str = "bm25"  # rag mode: bm25 | dense | hybrid
    encoder: str = "minilm"  # rag mode, dense/hybrid: encoder alias or folder
    k: int = 3  # passages in the prompt
    limit: int = 100  # questions (seeded sample across the articles); 0 = all
    max_new_tokens: int = 32  # answer length cap
    seed: int = 0  # question sample and passage order
    device: str = "auto"  # auto | cpu | cuda
    # decoder weights (rag.precision): auto (bf16 where fast, else fp32) | fp32 | bf16 | int8 (decode
    # steps through int8 linear layers, CPU: a decoder speed option, to measure its quality cost)
    decoder_precision: str = "auto"
    profile: str = "auto"  # prompt profile: auto (the decoder's measured best) | plain | fewshot
    removed_articles: int = 0  # rag mode: articles taken out of the index (their questions: refuse)
    unanswerable_limit: int = 100  # rag mode: questions asked from the removed articles
    complete_citations: bool = False  # rag mode: the pipeline's likelihood citation fallback
    # rag mode, rag.answer.refusal gate: 1.0 decodes every answer with the refusal barred and records
    # p(refusal), which evals.refusal_sweep turns into every threshold's metrics
    refusal_threshold: float | None = (
        None  # refuse only when p(refusal) >= this (rag.answer.refusal)
    )
    # decoder speed options (rag.generate.speed), to measure their quality cost
    decoder_compile: bool = False  # torch.compile the decoder
    cache_implementation: str = "dynamic"  # dynamic | static KV cache
    # rag mode, rag.answer.answerability: refuse before decoding when p(unanswerable) >= this; none = off
    answerability_threshold: float | None = DEFAULT_MODEL.threshold
    # rag mode, rag.answer.reader: the extractive reader first (auto = the trained minilm-reader
    # when there is one, as the product; none = off; or a folder); EM/F1 then score its short
    # answer when it gave one
    reader: str | None = "auto"
    reader_threshold: float | None = None  # None = the reader's own (chosen on train questions)
    compose: str = "decoder"  # decoder (sentence around the span) | extract (nothing decoded)
    # rag mode: decoder tokens of the encoder's excerpts of the passages (rag.answer.evidence);
    # 0 = whole passages; EM/F1 then score the reply's short answer where a passage holds it
    evidence_tokens: int = DEFAULT_EVIDENCE_TOKENS
    # passages retrieved for the encoder to read when excerpts are on (k when larger)
    evidence_passages: int = DEFAULT_EVIDENCE_PASSAGES
    engine: str = "auto"  # decoder engine: auto (OpenVINO where it can) | torch | openvino
    # rag mode, dense/hybrid: paragraph vectors from / into $RAG_HOME/cache/embeddings
    embedding_cache: bool = True


@dataclass
class Question:
    id: str
    text: str
    answers: list[str]
    paragraph: str  # gold paragraph id


def select_questions(
    paragraphs: list[SquadParagraph], articles: list[str], limit: int, seed: int
) -> list[Question]:
    """Questions of ``articles`` (seeded sample of ``limit`` when limit > 0), in a fixed order."""
    titles = {p.title for p in paragraphs}
    if unknown := sorted(set(articles) - titles):
        raise DatasetError(f"--articles: unknown article(s) {', '.join(unknown)}")
    qs = [
        Question(q.id, q.question, q.answers, p.id)
        for p in paragraphs
        if p.title in set(articles)
        for q in p.questions
    ]
    if limit and limit < len(qs):
        qs = random.Random(seed).sample(qs, limit)
    return qs


def removed_articles(articles: list[str], n: int, seed: int) -> list[str]:
    """``n`` of ``articles`` (seeded) to take out of the index for the refusal measurement."""
    if n < 0 or n >= len(articles) and n:
        raise ValueError(f"--removed-articles must be in [0, {len(articles) - 1}], not {n}")
    return sorted(random.Random(f"removed/{seed}").sample(sorted(articles), n)) if n else []


def holds_answer(text: str, answers: list[str]) -> bool:
    """True when a normalised gold answer occurs in the normalised passage."""
    norm = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(a)} " in norm for a in answers if normalize_answer(a))


class OraclePassages:
    """Gold paragraph + ``k - 1`` BM25 distractors from the same file, in a seeded order."""

    def __init__(self, paragraphs: list[SquadParagraph], k: int, seed: int):
        from rag.retrieval.bm25 import BM25Index

        self.by_id = {p.id: p for p in paragraphs}
        self.k, self.seed = k, seed
        self.bm25 = BM25Index(
            list(self.by_id), [f"{p.title.replace('_', ' ')} {p.context}" for p in paragraphs]
        )

    def __call__(self, q: Question) -> list[tuple[str, str]]:
        hits = self.bm25.search(q.text, self.k + 1)
        ids = [q.paragraph] + [d for d, _ in hits if d != q.paragraph][: self.k - 1]
        random.Random(f"{self.seed}/{q.id}").shuffle(ids)
        return [(d, self.by_id[d].context) for d in ids]


class ParagraphRetriever:
    """rag's ``CorpusRetriever`` over every paragraph of the file, with the ``search(query, k,
    mode) -> list[Hit]`` face that :class:`rag.pipeline.RAGPipeline` expects of a retriever."""

    def __init__(
        self,
        paragraphs: list[SquadParagraph],
        retriever: str,
        encoder,
        embeddings: EmbeddingCache | None = None,
    ):
        from rag.retrieval.retriever import CorpusRetriever
        from rag.retrieval.settings import RetrievalSettings

        self.by_id = {p.id: p for p in paragraphs}
        texts = [f"{p.title.replace('_', ' ')} {p.context}" for p in paragraphs]
        enc = encoder if retriever != "bm25" else None
        # RRF, as the numbers in docs/answering.md were measured (hybrid: plain RRF, no rerank)
        settings = RetrievalSettings(mode=retriever, fusion="rrf", rerank=None)
        self.index = CorpusRetriever(list(self.by_id), texts, enc, settings, embeddings=embeddings)
        self.mode = retriever

    def search(self, query: str, k: int = 5, mode: str | None = None) -> list:
        from rag.retrieval.retriever import FusedHit
        from rag.types import Chunk

        rows = self.index.engine.search_many([query], k, self.mode)[0]
        return [
            FusedHit(
                Chunk(r.id, self.by_id[r.id].context, self.by_id[r.id].title),
                r.score,
                rank,
                r.mode,
                dense_score=r.dense,
                bm25_score=r.bm25,
            )
            for rank, r in enumerate(rows, start=1)
        ]

    @property
    def encoder(self):
        """The encoder the paragraphs were embedded with (None for BM25): evidence selection
        reads with it, as the product's retriever does."""
        return self.index.encoder

    def coverage(self, query: str, hits: list) -> float | None:
        """rag.answer.answerability's IDF coverage over the indexed texts (title + paragraph)."""
        return self.index.coverage(query, [h.chunk.id for h in hits])


def answer_one(
    generator, q: Question, passages: list[tuple[str, str]], max_new_tokens: int
) -> dict:
    """Generate, parse citations and score one question; the row saved in ``predictions``."""
    texts = [t for _, t in passages]
    texts = generator.fit_passages(q.text, texts, max_new_tokens=max_new_tokens)
    given = passages[: len(texts)]
    gold = [
        i
        for i, (d, t) in enumerate(given, start=1)
        if d == q.paragraph or holds_answer(t, q.answers)
    ]
    t0 = time.perf_counter()
    messages = (
        generator.messages(q.text, texts)
        if hasattr(generator, "messages")
        else build_messages(q.text, texts)
    )
    raw = generator.generate(messages, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - t0
    parsed = parse_citations(raw, len(texts))
    return {
        "id": q.id,
        "question": q.text,
        "raw": raw,
        "answer": parsed.text,
        "gold_answers": q.answers,
        "passages": [d for d, _ in given],
        "gold_passages": gold,
        "cited": parsed.cited,
        "invalid_citations": parsed.invalid,
        "refused": parsed.refused,
        "em": exact_match(parsed.text, q.answers),
        "f1": f1_score(parsed.text, q.answers),
        "citation_correct": citation_correct(parsed.cited, gold) if gold else None,
        "seconds": round(seconds, 3),
    }


def answer_rag(pipeline, q: Question, k: int, mode: str, max_new_tokens: int) -> dict:
    """The full pipeline (retrieve, relevance gate, fit, generate, parse) on one question."""
    t0 = time.perf_counter()
    ans = pipeline.answer(q.text, k=k, mode=mode, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - t0
    given = [(h.chunk.id, h.chunk.text) for h in ans.passages]
    gold = [
        i
        for i, (d, t) in enumerate(given, start=1)
        if d == q.paragraph or holds_answer(t, q.answers)
    ]
    cited = [c.number for c in ans.citations]
    short = ans.answer_span.text if ans.answer_span else ans.text
    return {
        "id": q.id,
        "question": q.text,
        "raw": ans.raw_text,
        "answer": ans.text,
        "gold_answers": q.answers,
        "passages": [d for d, _ in given],
        "gold_passages": gold,
        "cited": cited,
        "invalid_citations": ans.invalid_citations,
        "refused": ans.refused,
        "answer_span": ans.answer_span.text if ans.answer_span else None,
        "em": exact_match(short, q.answers),
        "f1": f1_score(short, q.answers),
        "citation_correct": citation_correct(cited, gold) if gold else None,
        "citations_completed": ans.citations_completed,
        "refusal_probability": ans.refusal_probability,
        "unanswerable_probability": ans.unanswerable_probability,
        "new_tokens": int(ans.timings.get("new_tokens", 0)),
        "generate_s": round(ans.timings.get("generate_s", 0.0), 3),
        "seconds": round(seconds, 3),
    }


def summarize(rows: list[dict]) -> dict[str, float]:
    """Means over the per-question rows (EM/F1 as fractions, latency in seconds)."""
    lat = sorted(r["seconds"] for r in rows) or [0.0]
    unanswerable = [r for r in rows if r.get("answerable") is False]
    rows = [r for r in rows if r.get("answerable") is not False]
    n = len(rows) or 1
    answerable = [r for r in rows if r["citation_correct"] is not None]
    new_tokens = sum(r.get("new_tokens", 0) for r in rows + unanswerable)
    gen_s = sum(r.get("generate_s", 0.0) for r in rows + unanswerable)
    extra = {}
    if unanswerable:
        extra["refusal_rate_unanswerable"] = sum(r["refused"] for r in unanswerable) / len(
            unanswerable
        )
        extra["false_refusal_rate"] = sum(r["refused"] for r in answerable) / (len(answerable) or 1)
    if gen_s:
        extra["tokens_per_s"] = new_tokens / gen_s
    if any(r.get("answer_span") is not None for r in rows + unanswerable):
        extra["reader_span_rate"] = sum(r.get("answer_span") is not None for r in rows) / n
    return {
        "em": sum(r["em"] for r in rows) / n,
        "f1": sum(r["f1"] for r in rows) / n,
        "citation_accuracy": sum(r["citation_correct"] for r in answerable)
        / (len(answerable) or 1),
        "answer_in_context": len(answerable) / n,
        "refusal_rate": sum(r["refused"] for r in rows) / n,
        "invalid_citation_rate": sum(bool(r["invalid_citations"]) for r in rows) / n,
        "latency_mean_s": statistics.fmean(lat),
        "latency_p50_s": lat[len(lat) // 2],
        "latency_p90_s": lat[min(len(lat) - 1, int(0.90 * len(lat)))],
        "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        **extra,
    }


def load_generators(cfg: QAEvalConfig) -> tuple[Any, Any]:
    """(the generator with ``cfg.adapter``, the one for the k-passage prompt): the same unless
    the adapter was trained on the reader-first prompt alone, as in the product
    (rag.pipeline.RAGPipeline.fallback_generator)."""
    from rag.config import RAGConfig
    from rag.models import resolve_adapter, span_only_adapter
    from rag.pipeline import load_decoder

    decoding = RAGConfig(
        decoder=cfg.generator,
        device=cfg.device,
        decoder_precision=cfg.decoder_precision,
        profile=cfg.profile,
        decoder_compile=cfg.decoder_compile,
        cache_implementation=cfg.cache_implementation,
        engine=cfg.engine,
        batching=False,  # one question at a time, as the eval asks them
    )

    def load(adapter: str | None) -> Any:
        return load_decoder(decoding, adapter or "none")

    generator = load(cfg.adapter)
    spans_only = cfg.mode == "rag" and span_only_adapter(
        resolve_adapter(cfg.generator, cfg.adapter)
    )
    return generator, load(None) if spans_only else generator


def evaluate_qa(cfg: QAEvalConfig, generator=None, encoder=None, progress: bool = True) -> dict:
    """Run the evaluation; ``generator`` (a :class:`rag.generate.generator.Generator`) and ``encoder`` may
    be passed in already loaded (the experiment does), else they are loaded from ``cfg``."""
    if cfg.mode not in ("oracle", "rag"):
        raise ValueError(f"--mode must be oracle or rag, not {cfg.mode!r}")
    if cfg.retriever not in ("bm25", "dense", "hybrid"):
        raise ValueError(f"--retriever must be bm25, dense or hybrid, not {cfg.retriever!r}")
    if cfg.k < 1:
        raise ValueError(f"--k must be at least 1, not {cfg.k}")
    paragraphs = load_squad_paragraphs(cfg.squad)
    if cfg.split not in ("train", "dev"):
        raise ValueError(f"--split must be train or dev, not {cfg.split!r}")
    articles = cfg.articles or squad_split(cfg.squad)[cfg.split == "dev"]
    removed = removed_articles(articles, cfg.removed_articles, cfg.seed)
    if removed and cfg.mode != "rag":
        raise ValueError("--removed-articles needs --mode rag")
    asked = [a for a in articles if a not in removed]
    questions = select_questions(paragraphs, asked, cfg.limit, cfg.seed)
    unanswerable = select_questions(paragraphs, removed, cfg.unanswerable_limit, cfg.seed)
    fallback = generator
    if generator is None:
        generator, fallback = load_generators(cfg)
    bar = track(questions + unanswerable, f"qa {cfg.mode}", unit="question", enabled=progress)
    embeddings: EmbeddingCache | None = None
    if cfg.mode == "oracle":
        source = OraclePassages(paragraphs, cfg.k, cfg.seed)
        rows = [answer_one(generator, q, source(q), cfg.max_new_tokens) for q in bar]
    else:
        from rag.config import RAGConfig
        from rag.pipeline import RAGPipeline

        if encoder is None and cfg.retriever != "bm25":
            from rag.models import load_embedder

            encoder = load_embedder(cfg.encoder, device=cfg.device)
        kept = [p for p in paragraphs if p.title not in set(removed)]
        if cfg.embedding_cache and cfg.retriever != "bm25":
            embeddings = EmbeddingCache()
        retriever = ParagraphRetriever(kept, cfg.retriever, encoder, embeddings)
        # By default citation accuracy measures the markers the model writes itself, so the
        # pipeline's likelihood-based citation completion (a UI fallback) is off here.
        config = RAGConfig(
            complete_citations=cfg.complete_citations,
            refusal_threshold=cfg.refusal_threshold,
            answerability_threshold=cfg.answerability_threshold,
            reader=cfg.reader,
            reader_threshold=cfg.reader_threshold,
            compose=cfg.compose,
            evidence_tokens=cfg.evidence_tokens,
            evidence_passages=cfg.evidence_passages,
        )
        pipeline = RAGPipeline(
            config, retriever=retriever, generator=generator, fallback_generator=fallback
        )
        rows = []
        for q in bar:
            row = answer_rag(pipeline, q, cfg.k, cfg.retriever, cfg.max_new_tokens)
            row["answerable"] = q.paragraph.rsplit("/", 1)[0] not in removed
            rows.append(row)
    return {
        "config": {**asdict(cfg), "articles": articles, "removed": removed},
        "n_questions": len(rows),
        "metrics": {m: round(v, 4) for m, v in summarize(rows).items()},
        "embedding_cache": cache_stats(embeddings),
        "predictions": rows,
    }


def _summary(cfg: QAEvalConfig, result: dict) -> str:
    m = result["metrics"]
    line = (
        f"{cfg.generator} {cfg.mode} k={cfg.k}: EM {m['em']:.3f}  F1 {m['f1']:.3f}  citation acc "
        f"{m['citation_accuracy']:.3f}  refusals {m['refusal_rate']:.3f}  latency "
        f"{m['latency_mean_s']:.2f}s ({result['n_questions']} questions)"
    )
    if "refusal_rate_unanswerable" in m:
        line += (
            f"  unanswerable refused {m['refusal_rate_unanswerable']:.3f}"
            f"  false refusals {m['false_refusal_rate']:.3f}"
        )
    return line


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(
        "python -m evals.qa", __doc__, QAEvalConfig, out_file=True, required=("squad",)
    )
    return run_config_cli(parser, QAEvalConfig, evaluate_qa, argv, note=_summary)


if __name__ == "__main__":
    raise SystemExit(main())
