"""Documentation QA eval: keyword/page/citation metrics, the held-out question file, and the
run end to end with scripted pipelines (no models)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from evals.docqa import (
    DEFAULT_QUESTIONS,
    PROJECT_ROOT,
    DocQAConfig,
    DocQuestion,
    cites_page,
    evaluate_docqa,
    hit_rank,
    keyword_present,
    keywords_found,
    keywords_ok,
    load_questions,
    normalise_keywords,
    score_answer,
    source_matches,
    summarize,
    tokens_per_s,
)
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.prompt import REFUSAL
from rag.types import Answer, Chunk, Citation, Hit

QUESTIONS_FILE = PROJECT_ROOT / DEFAULT_QUESTIONS
DOCS = "/data/python-docs"  # absolute source prefix, as rag.ingest records today


def hit(source: str, i: int = 1, score: float = 0.5) -> Hit:
    return Hit(Chunk(f"c{i}", f"text {i}", source, ("H", str(i))), score, rank=i)


def answer(
    text: str,
    sources: list[str],
    cited: Sequence[int] = (),
    refused: bool = False,
    completed: bool = False,
    timings: dict[str, float] | None = None,
    invalid: Sequence[int] = (),
) -> Answer:
    """An Answer as the pipeline returns it: passages given, citations by passage number."""
    hits = [hit(s, i) for i, s in enumerate(sources, start=1)]
    citations = [
        Citation(n, hits[n - 1].chunk.source, ("H",), "t", hits[n - 1].score, hits[n - 1].chunk.id)
        for n in cited
    ]
    return Answer(
        text=text,
        citations=citations,
        raw_text=text,
        refused=refused,
        invalid_citations=list(invalid),
        passages=hits,
        timings=timings or {},
        citations_completed=completed,
    )


# ---------------------------------------------------------------------------- keywords


def test_keyword_is_case_insensitive_and_whole_word_at_word_ends():
    assert keyword_present("Use a SET to drop them", "set")
    assert not keyword_present("reset the list", "set")
    assert not keyword_present("tuples are immutable", "mutable")
    assert keyword_present("lists are mutable, tuples are not", "mutable")
    assert not keyword_present("you know it", "now")
    assert keyword_present("call datetime.now() for it", "now")


def test_keyword_punctuation_ends_match_anywhere_and_whitespace_is_collapsed():
    assert keyword_present("sorted(rows, key=lambda r: r['age'])", "key=")
    assert keyword_present("apply it with @functools.cache", "@")
    assert keyword_present("run `python3 -m venv .venv`", "-m venv")
    assert keyword_present("it is a\n  context   Manager", "context manager")
    assert keyword_present("it doesn\u2019t enforce them", "doesn't enforce")
    assert not keyword_present("anything", "   ")


def test_keyword_groups_are_or_within_and_across():
    groups = normalise_keywords([["dumps", "dump"], "loads"])
    assert groups == (("dumps", "dump"), ("loads",))
    assert keywords_found("json.dump(x, f) then json.loads(s)", groups) == [True, True]
    assert keywords_ok("json.dump(x, f) then json.loads(s)", groups)
    assert keywords_found("json.dumps(x)", groups) == [True, False]
    assert not keywords_ok("json.dumps(x)", groups)
    assert not keywords_ok("anything", [])


@pytest.mark.parametrize("bad", ["dumps", [], [[]], [["ok", ""]], [["ok"], 3], {"a": 1}])
def test_malformed_keywords_are_rejected(bad):
    with pytest.raises(ValueError):
        normalise_keywords(bad)


# ---------------------------------------------------------------------------- pages and citations


def test_source_matches_page_on_path_suffix():
    page = ["tutorial/inputoutput.rst.txt"]
    assert source_matches(f"{DOCS}/tutorial/inputoutput.rst.txt", page)
    assert source_matches("tutorial/inputoutput.rst.txt", page)  # relative sources, later
    assert source_matches("python-docs/tutorial/inputoutput.rst.txt", page)
    assert source_matches(r"C:\docs\tutorial\inputoutput.rst.txt", page)
    assert source_matches(
        f"{DOCS}/tutorial/inputoutput.rst.txt", ["./tutorial/inputoutput.rst.txt"]
    )
    assert not source_matches(f"{DOCS}/library/asyncio.rst.txt", ["library/io.rst.txt"])
    assert not source_matches(f"{DOCS}/mytutorial/inputoutput.rst.txt", page)
    assert not source_matches(f"{DOCS}/tutorial/inputoutput.rst.txt", [])


def test_hit_rank_is_the_first_matching_passage():
    pages = ["library/json.rst.txt", "tutorial/inputoutput.rst.txt"]
    sources = [f"{DOCS}/library/pickle.rst.txt", f"{DOCS}/tutorial/inputoutput.rst.txt"]
    assert hit_rank(sources, pages) == 2
    assert hit_rank(sources[:1], pages) is None
    assert hit_rank([], pages) is None


def test_right_page_citation_needs_one_cited_source_from_the_pages():
    pages = ["howto/sorting.rst.txt"]
    assert cites_page([f"{DOCS}/library/functions.rst.txt", f"{DOCS}/howto/sorting.rst.txt"], pages)
    assert not cites_page([f"{DOCS}/library/functions.rst.txt"], pages)
    assert not cites_page([], pages)


def test_tokens_per_s_needs_both_timings():
    assert tokens_per_s({"new_tokens": 30.0, "generate_s": 1.5}) == pytest.approx(20.0)
    assert tokens_per_s({"new_tokens": 30.0}) is None
    assert tokens_per_s({"new_tokens": 30.0, "generate_s": 0.0}) is None
    assert tokens_per_s({}) is None


def test_score_answer_and_summary_on_hand_made_answers():
    q = DocQuestion("q", "How do I sort?", ("howto/sorting.rst.txt",), (("sorted",), ("key=",)))
    right_page = f"{DOCS}/howto/sorting.rst.txt"
    other = f"{DOCS}/library/functions.rst.txt"
    good = score_answer(
        q,
        answer(
            "Call sorted(rows, key=f).",
            [other, right_page],
            cited=[2],
            timings={"new_tokens": 10.0, "generate_s": 0.5},
        ),
        1.0,
    )
    assert good["hit_rank"] == 2 and good["keywords_ok"] and good["cites_right_page"]
    assert good["new_tokens_per_s"] == 20.0 and good["citations"][0]["number"] == 2
    wrong_cite = score_answer(
        q,
        answer("Use sorted with key=f.", [other, right_page], cited=[1], completed=True),
        3.0,
    )
    assert wrong_cite["hit"] and wrong_cite["cited"] and not wrong_cite["cites_right_page"]
    refused = score_answer(q, answer(REFUSAL, [], refused=True), 2.0)
    assert not refused["hit"] and not refused["keywords_ok"] and refused["refused"]

    m = summarize([good, wrong_cite, refused])
    assert m["hit@k"] == pytest.approx(2 / 3)
    assert m["mrr@k"] == pytest.approx((0.5 + 0.5) / 3)
    assert m["keyword_rate"] == pytest.approx(2 / 3)
    assert m["right_page_citation_rate"] == pytest.approx(1 / 3)
    assert m["citation_rate"] == pytest.approx(2 / 3)
    assert m["completed_citation_rate"] == pytest.approx(1 / 3)
    assert m["self_citation_rate"] == pytest.approx(1 / 3)
    assert m["refusal_rate"] == pytest.approx(1 / 3)
    assert m["seconds_mean"] == pytest.approx(2.0) and m["seconds_p50"] == pytest.approx(2.0)
    assert m["new_tokens_per_s"] == pytest.approx(20.0)  # only the answer that reports it
    assert summarize([wrong_cite])["new_tokens_per_s"] is None


# ---------------------------------------------------------------------------- the question file


def test_question_file_is_well_formed():
    rows = [json.loads(line) for line in QUESTIONS_FILE.read_text().splitlines() if line.strip()]
    assert len(rows) == 40
    assert len({r["id"] for r in rows}) == 40
    assert len({r["question"].lower() for r in rows}) == 40
    questions = load_questions(QUESTIONS_FILE)  # validates shapes; raises on duplicates
    for r, q in zip(rows, questions):
        assert r["note"].strip() and "\n" not in r["note"], q.id
        assert 1 <= len(q.pages) <= 3 and len(set(q.pages)) == len(q.pages), q.id
        assert all(p.endswith(".rst.txt") and not p.startswith("/") for p in q.pages), q.id
        assert 2 <= len(q.keywords) <= 4, q.id
        assert all(a == a.lower() for g in q.keywords for a in g), q.id
        # Each group's first phrase is a right answer by itself (the e2e test relies on it).
        assert keywords_ok(" ".join(g[0] for g in q.keywords), q.keywords), q.id


@pytest.fixture(scope="module")
def python_docs() -> Path:
    """The python-docs folder, located like tests/conftest.py's ``shared_data``."""
    from rag.paths import shared_data_dir

    data = shared_data_dir()
    if data is None or not (data / "python-docs").is_dir():
        pytest.skip(
            "../shared/data/python-docs is absent (set RAG_SHARED_DATA to the folder holding it)"
        )
    return data / "python-docs"


@pytest.mark.data
def test_every_page_exists_and_holds_every_keyword_group(python_docs):
    for q in load_questions(QUESTIONS_FILE):
        texts = []
        for page in q.pages:
            path = python_docs / page
            assert path.is_file(), f"{q.id}: {page} is not under {python_docs}"
            texts.append(path.read_text(encoding="utf-8"))
        # The answer is really in the documents: every group occurs in one of the pages, and
        # the first (best) page holds at least one group.
        assert all(keywords_found("\n".join(texts), q.keywords)), q.id
        assert any(keywords_found(texts[0], q.keywords)), q.id


# ---------------------------------------------------------------------------- end to end


class ScriptedPipeline:
    """Returns a fixed Answer per question; records the call arguments."""

    def __init__(self, answers: dict[str, Answer]):
        self.answers, self.calls = answers, []

    def answer(self, question: str, **kw) -> Answer:
        self.calls.append((question, kw))
        return self.answers[question]


@pytest.fixture
def small_questions(tmp_path) -> Path:
    rows = [
        {
            "id": "a",
            "question": "What is a generator?",
            "pages": ["glossary.rst.txt"],
            "keywords": [["yield"], ["iterator", "iterators"]],
            "note": "glossary",
        },
        {
            "id": "b",
            "question": "How do I parse arguments?",
            "pages": ["howto/argparse.rst.txt", "library/argparse.rst.txt"],
            "keywords": [["argparse"], ["argumentparser", "add_argument"]],
            "note": "howto",
        },
        {
            "id": "c",
            "question": "What is the GIL?",
            "pages": ["glossary.rst.txt"],
            "keywords": ["global interpreter lock", ["one thread"]],
            "note": "glossary",
        },
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


def test_evaluate_docqa_end_to_end_with_a_scripted_pipeline(small_questions):
    pipe = ScriptedPipeline(
        {
            "What is a generator?": answer(
                "A function that uses yield and returns an iterator.",
                [f"{DOCS}/tutorial/classes.rst.txt", f"{DOCS}/glossary.rst.txt"],
                cited=[2],
                timings={"new_tokens": 12.0, "generate_s": 0.4, "total_s": 0.5},
            ),
            "How do I parse arguments?": answer(
                "Use argparse.",  # misses the second keyword group
                [f"{DOCS}/library/argparse.rst.txt"],
                cited=[1],
                completed=True,
                timings={"new_tokens": 4.0, "generate_s": 0.2},
            ),
            "What is the GIL?": answer(REFUSAL, [], refused=True),
        }
    )
    cfg = DocQAConfig(questions=str(small_questions), k=3, mode="bm25", max_new_tokens=64)
    out = evaluate_docqa(cfg, pipeline=pipe, progress=False)

    assert [c[1] for c in pipe.calls] == [{"k": 3, "mode": "bm25", "max_new_tokens": 64}] * 3
    assert out["n_questions"] == 3 and [r["id"] for r in out["predictions"]] == ["a", "b", "c"]
    m = out["metrics"]
    assert m["hit@k"] == pytest.approx(0.6667)
    assert m["mrr@k"] == pytest.approx(0.5)
    assert m["keyword_rate"] == pytest.approx(0.3333)
    assert m["right_page_citation_rate"] == pytest.approx(0.6667)
    assert m["citation_rate"] == pytest.approx(0.6667)
    assert m["completed_citation_rate"] == pytest.approx(0.3333)
    assert m["refusal_rate"] == pytest.approx(0.3333)
    assert m["new_tokens_per_s"] == pytest.approx(16 / 0.6, abs=1e-3)
    assert m["seconds_mean"] >= 0 and m["seconds_p50"] >= 0
    b = out["predictions"][1]
    assert b["keywords_found"] == [True, False] and b["citations_completed"]
    assert out["config"]["k"] == 3 and out["config"]["questions"] == str(small_questions)
    json.dumps(out)  # the result is plain JSON

    limited = evaluate_docqa(
        DocQAConfig(questions=str(small_questions), limit=1), pipeline=pipe, progress=False
    )
    assert limited["n_questions"] == 1


def test_perfect_answers_on_the_real_question_file_score_one():
    """Every question, answered with its first keyword alternatives from its first page and
    citing it, scores 1 everywhere: the default file loads from any working directory."""
    answers = {}
    for q in load_questions(QUESTIONS_FILE):
        text = "Answer: " + "; ".join(g[0] for g in q.keywords) + "."
        answers[q.question] = answer(text, [f"{DOCS}/{q.pages[0]}"], cited=[1])
    out = evaluate_docqa(DocQAConfig(), pipeline=ScriptedPipeline(answers), progress=False)
    m = out["metrics"]
    assert out["n_questions"] == 40
    assert m["hit@k"] == m["keyword_rate"] == m["right_page_citation_rate"] == 1.0
    assert m["refusal_rate"] == 0.0 and m["new_tokens_per_s"] is None


class ScoringGenerator:
    """A generator for the real RAGPipeline: writes a fixed reply and, asked which passage it
    used, scores the second one likeliest (so citation completion picks [2])."""

    def __init__(self, reply: str):
        self.reply = reply

    def fit_passages(self, question, passages, max_new_tokens=256):
        return list(passages)

    def generate(self, messages, **kw):
        kw["stats"].update(ttft_s=0.01, total_s=0.5, new_tokens=10)
        return self.reply

    def score_continuations(self, messages, answer, continuations):
        return [-1.0 if i == 1 else -5.0 for i in range(len(continuations))]


class ListRetriever:
    def __init__(self, hits: list[Hit]):
        self.hits = hits

    def search(self, query: str, k: int = 5, mode: str = "hybrid") -> list[Hit]:
        return self.hits[:k]


def test_evaluate_docqa_through_the_real_pipeline_with_completed_citations(small_questions):
    hits = [
        hit(f"{DOCS}/howto/functional.rst.txt", 1, 3.0),
        hit(f"{DOCS}/glossary.rst.txt", 2, 2.0),
    ]
    pipe = RAGPipeline(
        RAGConfig(complete_citations=True),
        retriever=ListRetriever(hits),
        generator=ScoringGenerator("It uses yield and gives an iterator."),
    )
    out = evaluate_docqa(
        DocQAConfig(questions=str(small_questions), mode="bm25", k=2), pipeline=pipe, progress=False
    )
    a = out["predictions"][0]
    assert a["hit_rank"] == 2 and a["keywords_ok"] and a["citations_completed"]
    assert a["cites_right_page"] and a["new_tokens_per_s"] == pytest.approx(20.0)
    assert out["metrics"]["completed_citation_rate"] == 1.0
    assert out["metrics"]["self_citation_rate"] == 0.0


def test_bad_settings_and_bad_rows_are_rejected(small_questions, tmp_path):
    with pytest.raises(ValueError, match="--mode"):
        evaluate_docqa(DocQAConfig(questions=str(small_questions), mode="sparse"), pipeline=None)
    with pytest.raises(ValueError, match="--k"):
        evaluate_docqa(DocQAConfig(questions=str(small_questions), k=0), pipeline=None)
    dup = tmp_path / "dup.jsonl"
    row = json.dumps({"id": "x", "question": "q", "pages": ["a.rst.txt"], "keywords": ["a", "b"]})
    dup.write_text(row + "\n" + row + "\n")
    with pytest.raises(ValueError, match=r"dup.jsonl:2: duplicate id 'x'"):
        load_questions(dup)
    nopages = tmp_path / "nopages.jsonl"
    nopages.write_text(json.dumps({"id": "x", "question": "q", "pages": [], "keywords": ["a"]}))
    with pytest.raises(ValueError, match="nopages.jsonl:1: pages"):
        load_questions(nopages)


def test_cli_writes_the_result_and_names_bad_flags(small_questions, tmp_path, monkeypatch, capsys):
    import evals.docqa as docqa

    pipe = ScriptedPipeline(
        {
            q.question: answer("yield iterator argparse add_argument", [], cited=[])
            for q in load_questions(small_questions)
        }
    )
    monkeypatch.setattr(docqa, "build_pipeline", lambda cfg: pipe)
    out = tmp_path / "out" / "docqa.json"
    argv = ["--questions", str(small_questions), "--no-complete-citations", "--out", str(out)]
    assert docqa.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["config"]["complete_citations"] is False and result["n_questions"] == 3
    assert "keywords 0.667" in capsys.readouterr().err

    assert docqa.main(["--questions", str(small_questions), "--mode", "sparse"]) == 2
    assert "--mode must be one of dense, bm25, hybrid, not 'sparse'" in capsys.readouterr().err
    assert docqa.main(["--questions", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        docqa.main(["--help"])
    text = buf.getvalue()
    for flag in (
        "--index",
        "--decoder",
        "--adapter",
        "--max-new-tokens",
        "--no-complete-citations",
    ):
        assert flag in text
