"""Grounded QA evaluation on SQuAD: EM/F1, citation accuracy, refusal rate and latency.

Two modes, both with the project's prompt format (:mod:`rag.answer.prompt`) and generator
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

The decoder and the answer settings are a :class:`rag.config.RAGConfig` (``QAEvalConfig.rag``)
with the sections' flags (:mod:`evals.pipeline_flags`), starting from :data:`EVAL_DEFAULTS` and
never read from a ``rag.toml``; the settings this eval fixes itself are :data:`EXCLUDED` (the
SQuAD paragraphs are searched with fixed settings, one question is decoded at a time, greedily).
``--mode`` is this eval's (oracle | rag): ``--retriever`` is the retrieval mode, and
``--generator`` another name of ``--decoder``.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from evals.pipeline_flags import Alias, EvalConfig, PipelineFlags, squad_search_excluded
from rag.answer.prompt import build_messages, parse_citations
from rag.cli.flags import run_config_cli
from rag.cli.progress import track
from rag.config import RAGConfig
from rag.defaults import MODES
from rag.evaluation.datasets import DatasetError, SquadParagraph, load_squad_paragraphs, squad_split
from rag.evaluation.metrics import citation_correct, exact_match, f1_score, normalize_answer
from rag.retrieval.embedding_cache import EmbeddingCache, cache_stats

_FIXED_SEARCH = (
    "rag mode searches the SQuAD paragraphs with fixed settings (ParagraphRetriever: RRF "
    "fusion, no rerank), as the docs/answering.md numbers were measured"
)
_UNBATCHED = "one question is decoded at a time (batching is off)"
# Pipeline settings the eval fixes itself (setting -> why it has no flag).
EXCLUDED: dict[str, str] = {
    **squad_search_excluded(_FIXED_SEARCH),
    "mode": "--mode is this eval's (oracle | rag); --retriever is the retrieval mode",
    "temperature": "greedy decoding (oracle mode calls the decoder itself, outside the pipeline)",
    "top_p": "greedy decoding (no sampling)",
    "batching": _UNBATCHED,
    "max_batch": _UNBATCHED,
    "max_prefill_tokens": _UNBATCHED,
}
# Where the eval starts other than the sections' defaults: the small decoder alone, BM25 over
# the paragraphs (minilm for dense and hybrid), 3 passages, short answers, the markers the
# model writes itself (no citation completion, a UI fallback), unbatched decoding.
EVAL_DEFAULTS: dict[str, Any] = {
    "decoder": "smollm2",
    "adapter": None,
    "mode": "bm25",
    "encoder": "minilm",
    "k": 3,
    "max_new_tokens": 32,
    "complete_citations": False,
    "batching": False,
}
PIPELINE = PipelineFlags(
    EXCLUDED,
    EVAL_DEFAULTS,
    aliases={
        "generator": Alias("decoder", "the decoder (the same as --decoder)"),
        "retriever": Alias("mode", "rag mode: the retrieval mode over the paragraphs", MODES),
    },
    help={
        "k": "passages in the prompt",
        "encoder": "rag mode, dense/hybrid: encoder alias or folder of the paragraphs",
        "max_new_tokens": "answer length cap",
        "complete_citations": "rag mode: the pipeline's likelihood citation fallback (off: "
        "citation accuracy measures the markers the model writes itself)",
        "refusal_threshold": "rag mode, rag.answer.refusal gate: refuse only when p(refusal) "
        ">= this; 1.0 decodes every answer with the refusal barred and records p(refusal), which "
        "evals.refusal_sweep turns into every threshold's metrics; none = the adapter's own",
    },
)


@dataclass
class QAEvalConfig(EvalConfig):
    """One QA evaluation; every field (and every pipeline setting) is written to the output
    JSON."""

    PIPELINE: ClassVar[PipelineFlags] = PIPELINE

    squad: str = ""  # SQuAD v1.1 JSON file
    articles: list[str] = field(default_factory=list)  # article titles; empty = --split's articles
    split: str = "dev"  # dev (held-out articles: report here) | train (tune thresholds here)
    mode: str = "oracle"  # oracle (gold among BM25 distractors) | rag (retrieve, all paragraphs)
    limit: int = 100  # questions (seeded sample across the articles); 0 = all
    seed: int = 0  # question sample and passage order
    removed_articles: int = 0  # rag mode: articles taken out of the index (their questions: refuse)
    unanswerable_limit: int = 100  # rag mode: questions asked from the removed articles
    # rag mode, dense/hybrid: paragraph vectors from / into $RAG_HOME/cache/embeddings
    embedding_cache: bool = True
    # the decoder and the answer settings: EVAL_DEFAULTS over the sections' defaults, then the
    # flags (rag mode: the pipeline's, as the product answers; EM/F1 then score the reader's
    # short answer, or the reply's short answer line, where there is one)
    rag: RAGConfig = field(default_factory=PIPELINE.config)


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


def load_generators(cfg: QAEvalConfig) -> tuple[Any, Any, Any]:
    """(the generator with the configured adapter, the one for the k-passage prompt, the one
    that copies factoids' short answers), as in the product (rag.pipeline.RAGPipeline): the
    second is the first unless the adapter was trained on the reader-first prompt alone, the
    third the second unless ``factoid_decoder`` resolves to another decoder. All from
    ``cfg.rag.generate`` (unbatched: one question at a time, as the eval asks them)."""
    from rag.generate.load import load_decoder
    from rag.models import resolve_adapter, span_only_adapter
    from rag.pipeline import load_factoid_decoder, separate_factoid_decoder

    gen = cfg.rag.generate

    def load(adapter: str | None) -> Any:
        return load_decoder(gen, cfg.rag.device, adapter or "none")

    generator = load(gen.adapter)
    spans_only = cfg.mode == "rag" and span_only_adapter(resolve_adapter(gen.decoder, gen.adapter))
    fallback = load(None) if spans_only else generator
    if cfg.mode != "rag" or separate_factoid_decoder(gen) is None:
        return generator, fallback, fallback
    return generator, fallback, load_factoid_decoder(gen, cfg.rag.device)


def evaluate_qa(cfg: QAEvalConfig, generator=None, encoder=None, progress: bool = True) -> dict:
    """Run the evaluation; ``generator`` (a :class:`rag.generate.generator.Generator`) and ``encoder`` may
    be passed in already loaded (the experiment does), else they are loaded from ``cfg``."""
    if cfg.mode not in ("oracle", "rag"):
        raise ValueError(f"--mode must be oracle or rag, not {cfg.mode!r}")
    ret, max_new_tokens = cfg.rag.retrieval, cfg.rag.generate.max_new_tokens  # checked by them
    if cfg.mode == "rag" and ret.mode != "bm25" and not ret.encoder:
        raise ValueError(f"--retriever {ret.mode} needs an --encoder")
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
    fallback = factoid = generator
    if generator is None:
        generator, fallback, factoid = load_generators(cfg)
    bar = track(questions + unanswerable, f"qa {cfg.mode}", unit="question", enabled=progress)
    embeddings: EmbeddingCache | None = None
    if cfg.mode == "oracle":
        source = OraclePassages(paragraphs, ret.k, cfg.seed)
        rows = [answer_one(generator, q, source(q), max_new_tokens) for q in bar]
    else:
        from rag.pipeline import RAGPipeline

        if encoder is None and ret.mode != "bm25":
            from rag.models import load_embedder

            encoder = load_embedder(ret.encoder, device=cfg.rag.device)
        kept = [p for p in paragraphs if p.title not in set(removed)]
        if cfg.embedding_cache and ret.mode != "bm25":
            embeddings = EmbeddingCache()
        retriever = ParagraphRetriever(kept, ret.mode, encoder, embeddings)
        # By default citation accuracy measures the markers the model writes itself, so the
        # pipeline's likelihood-based citation completion (a UI fallback) is off here.
        pipeline = RAGPipeline(
            cfg.rag,
            retriever=retriever,
            generator=generator,
            fallback_generator=fallback,
            factoid_generator=factoid,
        )
        rows = []
        for q in bar:
            row = answer_rag(pipeline, q, ret.k, ret.mode, max_new_tokens)
            row["answerable"] = q.paragraph.rsplit("/", 1)[0] not in removed
            rows.append(row)
    return {
        "config": {**cfg.to_dict(), "articles": articles, "removed": removed},
        "n_questions": len(rows),
        "metrics": {m: round(v, 4) for m, v in summarize(rows).items()},
        "embedding_cache": cache_stats(embeddings),
        "predictions": rows,
    }


def _summary(cfg: QAEvalConfig, result: dict) -> str:
    m = result["metrics"]
    line = (
        f"{cfg.rag.generate.decoder} {cfg.mode} k={cfg.rag.retrieval.k}: EM {m['em']:.3f}  F1 {m['f1']:.3f}  citation acc "
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
    parser = QAEvalConfig.parser("python -m evals.qa", __doc__, required=("squad",))
    return run_config_cli(
        parser, QAEvalConfig, evaluate_qa, argv, note=_summary, build=QAEvalConfig.from_args
    )


if __name__ == "__main__":
    raise SystemExit(main())
