"""Documentation QA: the full RAG pipeline on questions a Python user asks of the Python docs.

SQuAD (:mod:`evals.qa`) measures the reader on short extractive answers; this eval measures the
product as a user meets it: :meth:`rag.pipeline.RAGPipeline.answer` over an index of
``../shared/data/python-docs`` (``python -m rag.ingest ../shared/data/python-docs --index
pydocs``), on 40 hand-written how-to / what-is questions (``evals/data/pydocs_qa.jsonl``, held
out: see ``evals/data/README.md``). Each question names the 1-3 pages that answer it and the
answer keywords a right answer contains, so no reference answer text or judge model is needed.
The same format serves the Git manual (``evals/data/gitdocs_qa.jsonl``, index built from
``../shared/data/corpus/git-doc``) and the Linux kernel docs (``evals/data/linuxdocs_qa.jsonl``,
from ``../shared/data/corpus/linux-doc``). Those files add two fields per question: ``split``
(``dev``, for choosing settings, or ``test``, held out; ``--split`` picks one, a file without
the field counts as ``test``) and ``answerable`` (``false``: the documents do not hold the answer,
so the right response is a refusal; such a question has no pages and no keywords).

Measured, per question and as rates; the page and keyword rates are over the answerable
questions only (unanswerable ones have nothing to find):

- ``hit@k``: a passage given to the decoder comes from one of the question's pages (after the
  relevance gate and context fitting, so these are the passages the answer could use); a
  source matches a page when its path ends with the page's relative path (sources are absolute
  paths today, relative ones match too); ``mrr@k`` the mean reciprocal rank of the first such;
- ``keyword_rate``: every keyword group occurs in ``Answer.text`` (see :func:`keywords_found`);
- ``right_page_citation_rate``: at least one citation points at one of the pages;
- ``false_refusal_rate``: refusals among the answerable questions; ``unanswerable_refusal_rate``:
  refusals among the unanswerable ones (the higher the better; None when the run has none);
- over all questions: ``citation_rate`` (any citation), ``refusal_rate``,
  ``invalid_citation_rate``;
- ``completed_citation_rate``: citations the pipeline appended by likelihood because the
  decoder wrote no marker (``Answer.citations_completed``); ``self_citation_rate``: answers
  whose citation the decoder wrote itself;
- ``seconds_mean`` / ``seconds_p50`` per answer (models are loaded before the clock starts) and
  ``new_tokens_per_s`` (all new tokens over all decoding seconds, from ``Answer.timings``).

The pipeline's settings are a :class:`rag.config.RAGConfig` (``DocQAConfig.rag``) whose flags are
the sections' own, as ``rag.ask`` names them (:mod:`evals.pipeline_flags`): every setting is a flag
(:data:`EXCLUDED` is empty: the eval answers as the product does), starting from
:data:`EVAL_DEFAULTS`. They come from those values and the flags only (never from a ``rag.toml``
in the working directory), and the result JSON records every one, so it says everything that
produced it.

CLI::

    python -m evals.docqa --index pydocs --decoder smollm2 --out artifacts/evals/docqa-smollm2.json
    python -m evals.docqa --index gitdocs --questions evals/data/gitdocs_qa.jsonl --split dev
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from evals.pipeline_flags import EvalConfig, PipelineFlags
from rag.cli.flags import run_config_cli
from rag.cli.progress import track
from rag.config import RAGConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUESTIONS = "evals/data/pydocs_qa.jsonl"
SPLITS = ("all", "dev", "test")  # --split: every question, or only those of one split
QUESTION_SPLITS = ("dev", "test")  # a question's ``split``; a file without the field: "test"

# Pipeline settings the eval fixes itself (setting -> why it has no flag): none, it answers
# through the whole pipeline as the product does.
EXCLUDED: dict[str, str] = {}
# Where the eval starts other than the sections' defaults: the python-docs index and the small
# decoder alone; the rest is the product's (hybrid retrieval, k = 5 passages: hit@k is over
# them, the reader, excerpts, citation completion: completed_citation_rate says how often).
EVAL_DEFAULTS: dict[str, Any] = {"index": "pydocs", "decoder": "smollm2", "adapter": None}
PIPELINE = PipelineFlags(EXCLUDED, EVAL_DEFAULTS)


@dataclass
class DocQAConfig(EvalConfig):
    """One documentation-QA run; every field (and every pipeline setting) is written to the
    output JSON."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"split": SPLITS}
    PIPELINE: ClassVar[PipelineFlags] = PIPELINE

    questions: str = DEFAULT_QUESTIONS  # JSONL question file (its test split is held out)
    # all | dev | test: only the questions of that split (dev for choosing settings, test held
    # out: never tune on it); questions without a split field count as test
    split: str = "all"
    limit: int = 0  # first N questions (of the chosen split); 0 = all
    # the pipeline's settings: EVAL_DEFAULTS over the sections' defaults, then the flags
    rag: RAGConfig = field(default_factory=PIPELINE.config)


# ---------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class DocQuestion:
    """One question: the pages that answer it and the keyword groups a right answer holds; an
    unanswerable question (the documents do not hold the answer) has neither."""

    id: str
    question: str
    pages: tuple[str, ...]  # relative to the docs folder, e.g. tutorial/inputoutput.rst.txt
    keywords: tuple[tuple[str, ...], ...]  # AND over groups, OR within a group
    note: str = ""
    split: str = "test"  # dev (for choosing settings) | test (held out)
    answerable: bool = True  # False: the right response is a refusal


def normalise_keywords(keywords: Any) -> tuple[tuple[str, ...], ...]:
    """Keyword groups from the file's ``keywords``: a list whose items are a phrase (a group of
    one) or a list of alternative phrases. Raises ValueError on any other shape or an empty
    phrase, so a malformed row fails at load time rather than scoring every answer as wrong."""
    if isinstance(keywords, str) or not isinstance(keywords, list) or not keywords:
        raise ValueError("keywords must be a non-empty list of phrases or lists of phrases")
    groups = []
    for group in keywords:
        alts = [group] if isinstance(group, str) else group
        if not isinstance(alts, list) or not alts:
            raise ValueError(f"keyword group {group!r} must be a phrase or a non-empty list")
        if not all(isinstance(a, str) and a.strip() for a in alts):
            raise ValueError(f"keyword group {group!r} holds an empty or non-string phrase")
        groups.append(tuple(a.strip() for a in alts))
    return tuple(groups)


def resolve_questions_path(path: str | Path) -> Path:
    """``path`` as given when it exists, else relative to the project root, so the default
    works from any working directory."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    return PROJECT_ROOT / p


def load_questions(path: str | Path) -> list[DocQuestion]:
    """Rows of a question JSONL file (blank lines skipped); errors name the file and line.

    Optional fields: ``split`` (``dev`` | ``test``; absent = ``test``) and ``answerable``
    (a JSON bool; absent = true). An answerable row needs 1+ pages and keyword groups; an
    unanswerable one must have ``"pages": []`` and ``"keywords": []``."""
    p = resolve_questions_path(path)
    out: list[DocQuestion] = []
    seen: set[str] = set()
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON: {e}") from e
        missing = [f for f in ("id", "question", "pages", "keywords") if f not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        split = row.get("split", "test")
        if split not in QUESTION_SPLITS:
            raise ValueError(f"{where}: split must be one of {', '.join(QUESTION_SPLITS)}")
        answerable = row.get("answerable", True)
        if not isinstance(answerable, bool):
            raise ValueError(f"{where}: answerable must be true or false")
        pages = row["pages"]
        if not answerable:
            if pages != [] or row["keywords"] != []:
                raise ValueError(f"{where}: an unanswerable question has no pages and no keywords")
        elif not isinstance(pages, list) or not pages or not all(isinstance(x, str) for x in pages):
            raise ValueError(f"{where}: pages must be a non-empty list of relative paths")
        if str(row["id"]) in seen:
            raise ValueError(f"{where}: duplicate id {row['id']!r}")
        seen.add(str(row["id"]))
        try:
            keywords = normalise_keywords(row["keywords"]) if answerable else ()
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        out.append(
            DocQuestion(
                str(row["id"]),
                str(row["question"]),
                tuple(pg.removeprefix("./") for pg in pages),
                keywords,
                str(row.get("note", "")),
                split,
                answerable,
            )
        )
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


def select_split(questions: Sequence[DocQuestion], split: str) -> list[DocQuestion]:
    """The questions of ``split`` (``dev`` | ``test``), or all of them for ``all``."""
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}, not {split!r}")
    return [q for q in questions if split == "all" or q.split == split]


# ---------------------------------------------------------------------------- metrics


def _normalise_text(text: str) -> str:
    """Lower case, typographic apostrophes made plain, whitespace collapsed."""
    return " ".join(text.lower().replace("\u2019", "'").split())


def keyword_present(text: str, phrase: str) -> bool:
    """True when ``phrase`` occurs in ``text``, case-insensitively, as a whole word or phrase.

    Whole-word at each end that is a letter, digit or underscore (so ``set`` is not found in
    ``reset`` and ``mutable`` not in ``immutable``); ends that are punctuation (``key=``,
    ``copy()``, ``@``) match anywhere. Whitespace inside the phrase matches any whitespace.
    """
    phrase = _normalise_text(phrase)
    if not phrase:
        return False
    left = r"(?<!\w)" if re.match(r"\w", phrase[0]) else ""
    right = r"(?!\w)" if re.match(r"\w", phrase[-1]) else ""
    return re.search(left + re.escape(phrase) + right, _normalise_text(text)) is not None


def keywords_found(text: str, groups: Iterable[Sequence[str]]) -> list[bool]:
    """Per group: does any of its alternatives occur in ``text`` (:func:`keyword_present`)?"""
    return [any(keyword_present(text, alt) for alt in group) for group in groups]


def keywords_ok(text: str, groups: Iterable[Sequence[str]]) -> bool:
    """An answer is right when every keyword group is present (AND across groups)."""
    found = keywords_found(text, groups)
    return bool(found) and all(found)


def source_matches(source: str, pages: Iterable[str]) -> bool:
    """True when ``source`` is one of ``pages``: equal, or ending with ``/`` + the page.

    Matching on the path suffix (at a ``/`` boundary) lets the same question file score an index
    that stores absolute paths and one that stores paths relative to any parent folder, without
    ``library/io.rst.txt`` matching ``library/asyncio.rst.txt``.
    """
    src = source.replace("\\", "/")
    for page in pages:
        pg = page.replace("\\", "/").removeprefix("./").lstrip("/")
        if pg and (src == pg or src.endswith("/" + pg)):
            return True
    return False


def hit_rank(sources: Sequence[str], pages: Iterable[str]) -> int | None:
    """1-based rank of the first source from one of ``pages``; None when none is."""
    pages = list(pages)
    for rank, src in enumerate(sources, start=1):
        if source_matches(src, pages):
            return rank
    return None


def cites_page(cited_sources: Iterable[str], pages: Iterable[str]) -> bool:
    """At least one cited passage comes from one of ``pages``."""
    pages = list(pages)
    return any(source_matches(s, pages) for s in cited_sources)


def tokens_per_s(timings: Mapping[str, float]) -> float | None:
    """New tokens per decoding second from ``Answer.timings``; None when they are missing
    (a refusal never decodes, a fake generator may not report)."""
    new, secs = timings.get("new_tokens"), timings.get("generate_s")
    if new is None or not secs:
        return None
    return float(new) / float(secs)


def score_answer(q: DocQuestion, answer: Any, seconds: float) -> dict[str, Any]:
    """The prediction row for one question: what was retrieved, said and cited, and its scores."""
    sources = [h.chunk.source for h in answer.passages]
    rank = hit_rank(sources, q.pages)
    found = keywords_found(answer.text, q.keywords)
    cited = [c.source for c in answer.citations]
    timings = {k: round(float(v), 4) for k, v in (answer.timings or {}).items()}
    tps = tokens_per_s(answer.timings or {})
    return {
        "id": q.id,
        "question": q.question,
        "split": q.split,
        "answerable": q.answerable,
        "pages": list(q.pages),
        "keywords": [list(g) for g in q.keywords],
        "answer": answer.text,
        "raw": answer.raw_text,
        "query": answer.query,
        "refused": bool(answer.refused),
        "passages": [
            {
                "source": h.chunk.source,
                "heading_path": list(h.chunk.heading_path),
                "chunk_id": h.chunk.id,
                "score": round(float(h.score), 4),
            }
            for h in answer.passages
        ],
        "citations": [
            {"number": c.number, "source": c.source, "heading_path": list(c.heading_path)}
            for c in answer.citations
        ],
        "invalid_citations": list(answer.invalid_citations),
        "citations_completed": bool(answer.citations_completed),
        "hit_rank": rank,
        "hit": rank is not None,
        "keywords_found": found,
        "keywords_ok": bool(found) and all(found),
        "cited": bool(cited),
        "cites_right_page": cites_page(cited, q.pages),
        "seconds": round(seconds, 4),
        "new_tokens_per_s": None if tps is None else round(tps, 2),
        "timings": timings,
    }


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Rates over the questions (a refusal counts as a miss everywhere but the refusal rates).

    ``hit@k``, ``mrr@k``, ``keyword_rate``, ``right_page_citation_rate`` and
    ``false_refusal_rate`` are over the answerable rows (None when there are none);
    ``unanswerable_refusal_rate`` is refused / unanswerable rows (None when there are none);
    the other rates and the timings are over all rows. A row without ``answerable`` counts as
    answerable, so a file of answerable questions scores exactly as before the field existed.
    """
    n = len(rows) or 1
    answerable = [r for r in rows if r.get("answerable", True)]
    unanswerable = [r for r in rows if not r.get("answerable", True)]

    def rate(key: str) -> float:
        return sum(bool(r[key]) for r in rows) / n

    def rate_over(subset: Sequence[Mapping[str, Any]], key: str) -> float | None:
        return sum(bool(r[key]) for r in subset) / len(subset) if subset else None

    secs = [float(r["seconds"]) for r in rows]
    new_tokens = [r["timings"].get("new_tokens") for r in rows]
    gen_s = [r["timings"].get("generate_s") for r in rows]
    pairs = [(t, s) for t, s in zip(new_tokens, gen_s) if t is not None and s]
    return {
        "hit@k": rate_over(answerable, "hit"),
        "mrr@k": (
            sum(1.0 / r["hit_rank"] for r in answerable if r["hit_rank"]) / len(answerable)
            if answerable
            else None
        ),
        "keyword_rate": rate_over(answerable, "keywords_ok"),
        "right_page_citation_rate": rate_over(answerable, "cites_right_page"),
        "false_refusal_rate": rate_over(answerable, "refused"),
        "unanswerable_refusal_rate": rate_over(unanswerable, "refused"),
        "citation_rate": rate("cited"),
        "refusal_rate": rate("refused"),
        "completed_citation_rate": rate("citations_completed"),
        "self_citation_rate": sum(r["cited"] and not r["citations_completed"] for r in rows) / n,
        "invalid_citation_rate": sum(bool(r["invalid_citations"]) for r in rows) / n,
        "seconds_mean": statistics.fmean(secs) if secs else 0.0,
        "seconds_p50": statistics.median(secs) if secs else 0.0,
        "seconds_p90": sorted(secs)[min(len(secs) - 1, int(0.9 * len(secs)))] if secs else 0.0,
        "new_tokens_per_s": (
            sum(t for t, _ in pairs) / sum(s for _, s in pairs) if pairs else None
        ),
    }


# ---------------------------------------------------------------------------- run


def build_pipeline(cfg: DocQAConfig) -> Any:
    """A :class:`rag.pipeline.RAGPipeline` from ``cfg.rag`` alone, models loaded now so that a
    missing index or model fails before the first question and no answer's time includes
    loading."""
    from rag.pipeline import RAGPipeline

    pipeline = RAGPipeline(cfg.rag)
    pipeline.load_models()  # every decoder too (the 1.5B for factoids), as the server does
    return pipeline


def evaluate_docqa(cfg: DocQAConfig, pipeline: Any = None, progress: bool = True) -> dict:
    """Answer every question with ``pipeline.answer`` and score it; ``pipeline`` may be passed
    in (tests, or an experiment reusing loaded models), else it is built from ``cfg``. Only
    ``answer(question, k=, mode=, max_new_tokens=)`` returning a :class:`rag.types.Answer` is
    used (with ``cfg.rag``'s k, mode and max_new_tokens, which its sections checked); the other
    pipeline settings (``complete_citations``, ...) apply only to a pipeline built here."""
    if cfg.limit < 0:
        raise ValueError(f"--limit must be 0 (all) or more, not {cfg.limit}")
    if cfg.split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}, not {cfg.split!r}")
    questions = select_split(load_questions(cfg.questions), cfg.split)
    if not questions:
        raise ValueError(f"{cfg.questions}: no questions in the {cfg.split!r} split")
    if cfg.limit:
        questions = questions[: cfg.limit]
    load_s = 0.0
    if pipeline is None:
        t0 = time.perf_counter()
        pipeline = build_pipeline(cfg)
        load_s = time.perf_counter() - t0
    rows = []
    ret, gen = cfg.rag.retrieval, cfg.rag.generate
    for q in track(questions, "docqa", unit="question", enabled=progress):
        t0 = time.perf_counter()
        ans = pipeline.answer(q.question, k=ret.k, mode=ret.mode, max_new_tokens=gen.max_new_tokens)
        rows.append(score_answer(q, ans, time.perf_counter() - t0))
    metrics = summarize(rows)
    return {
        "config": {**cfg.to_dict(), "questions": str(resolve_questions_path(cfg.questions))},
        "n_questions": len(rows),
        "n_unanswerable": sum(not q.answerable for q in questions),
        "load_s": round(load_s, 3),
        "metrics": {m: (None if v is None else round(v, 4)) for m, v in metrics.items()},
        "predictions": rows,
    }


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _summary(cfg: DocQAConfig, result: dict) -> str:
    m = result["metrics"]
    tps = m["new_tokens_per_s"]
    speed = f"  {tps:.1f} tok/s" if tps is not None else ""
    n_un = result.get("n_unanswerable", 0)
    unans = f"  unanswerable refused {_rate(m['unanswerable_refusal_rate'])}" if n_un else ""
    split = "" if cfg.split == "all" else f", {cfg.split} split"
    rag = cfg.rag
    return (
        f"{rag.generate.decoder} on {rag.index} ({rag.retrieval.mode}, k={rag.retrieval.k}): "
        f"hit@k {_rate(m['hit@k'])}  "
        f"keywords {_rate(m['keyword_rate'])}  "
        f"right-page cites {_rate(m['right_page_citation_rate'])}  "
        f"cites {m['citation_rate']:.3f}  completed {m['completed_citation_rate']:.3f}  "
        f"refusals {m['refusal_rate']:.3f}{unans}  {m['seconds_mean']:.2f}s/answer "
        f"(p50 {m['seconds_p50']:.2f}s){speed} ({result['n_questions']} questions{split})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = DocQAConfig.parser("python -m evals.docqa", __doc__)
    return run_config_cli(
        parser, DocQAConfig, evaluate_docqa, argv, note=_summary, build=DocQAConfig.from_args
    )


if __name__ == "__main__":
    raise SystemExit(main())
