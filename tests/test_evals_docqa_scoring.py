"""Documentation QA eval, the scoring: keyword, page and citation metrics on hand-made answers,
and the held-out question file (well formed; with ../shared/data, every page holds its
keywords). End to end: test_evals_docqa.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from docqa_support import DOCS, QUESTIONS_FILE, answer

from evals.docqa import (
    DocQuestion,
    cites_page,
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
from rag.answer.prompt import REFUSAL

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
    from rag.storage.paths import shared_data_dir

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
