"""Documentation QA eval end to end with scripted pipelines (no models), through the real
pipeline, and its CLI; the Git and Linux question files (splits, unanswerable questions) and the
scoring of unanswerable questions. The metrics and the Python question file:
test_evals_docqa_scoring.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from docqa_support import DOCS, QUESTIONS_FILE, answer, hit

from evals.docqa import (
    PROJECT_ROOT,
    DocQAConfig,
    evaluate_docqa,
    keywords_found,
    keywords_ok,
    load_questions,
    select_split,
    summarize,
)
from rag.answer.prompt import REFUSAL
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.types import Answer, Hit

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
    cfg = DocQAConfig.of(questions=str(small_questions), k=3, mode="bm25", max_new_tokens=64)
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
    assert out["config"]["rag"]["retrieval"]["k"] == 3 and out["config"]["questions"] == str(
        small_questions
    )
    json.dumps(out)  # the result is plain JSON

    limited = evaluate_docqa(
        DocQAConfig.of(questions=str(small_questions), limit=1), pipeline=pipe, progress=False
    )
    assert limited["n_questions"] == 1


def test_perfect_answers_on_the_real_question_file_score_one():
    """Every question, answered with its first keyword alternatives from its first page and
    citing it, scores 1 everywhere: the default file loads from any working directory."""
    answers = {}
    for q in load_questions(QUESTIONS_FILE):
        text = "Answer: " + "; ".join(g[0] for g in q.keywords) + "."
        answers[q.question] = answer(text, [f"{DOCS}/{q.pages[0]}"], cited=[1])
    out = evaluate_docqa(DocQAConfig.of(), pipeline=ScriptedPipeline(answers), progress=False)
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

    def stream(self, messages, **kw):  # one body with generate, as the engines have
        yield self.generate(messages, **kw)

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
        RAGConfig.of(complete_citations=True),
        retriever=ListRetriever(hits),
        generator=ScoringGenerator("It uses yield and gives an iterator."),
    )
    out = evaluate_docqa(
        DocQAConfig.of(questions=str(small_questions), mode="bm25", k=2),
        pipeline=pipe,
        progress=False,
    )
    a = out["predictions"][0]
    assert a["hit_rank"] == 2 and a["keywords_ok"] and a["citations_completed"]
    assert a["cites_right_page"] and a["new_tokens_per_s"] == pytest.approx(20.0)
    assert out["metrics"]["completed_citation_rate"] == 1.0
    assert out["metrics"]["self_citation_rate"] == 0.0


def test_bad_settings_and_bad_rows_are_rejected(small_questions, tmp_path):
    with pytest.raises(ValueError, match="--mode"):
        evaluate_docqa(DocQAConfig.of(questions=str(small_questions), mode="sparse"), pipeline=None)
    with pytest.raises(ValueError, match="--k"):
        evaluate_docqa(DocQAConfig.of(questions=str(small_questions), k=0), pipeline=None)
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
    assert (
        result["config"]["rag"]["answer"]["complete_citations"] is False
        and result["n_questions"] == 3
    )
    assert "keywords 0.667" in capsys.readouterr().err

    with pytest.raises(SystemExit) as exc:  # the section's value set: stops at parse time
        docqa.main(["--questions", str(small_questions), "--mode", "sparse"])
    assert exc.value.code == 2
    assert "--mode: invalid choice: 'sparse'" in capsys.readouterr().err
    assert docqa.main(["--questions", str(small_questions), "--k", "0"]) == 2
    assert "--k must be positive, not 0" in capsys.readouterr().err
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


# ---------------------------------------------------------------------------- Git and Linux files

# file -> (docs folder under ../shared/data, questions, unanswerable, per split)
SPLIT_FILES = {
    "gitdocs_qa.jsonl": ("corpus/git-doc", 48, 8, 24),
    "linuxdocs_qa.jsonl": ("corpus/linux-doc", 40, 6, 20),
}


def _rows(name: str) -> list[dict]:
    text = (PROJECT_ROOT / "evals" / "data" / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(SPLIT_FILES))
def test_split_question_files_are_well_formed(name):
    _, n, n_unanswerable, per_split = SPLIT_FILES[name]
    rows = _rows(name)
    assert len(rows) == n
    assert len({r["id"] for r in rows}) == n, "ids are unique"
    assert len({r["question"].strip().lower() for r in rows}) == n, "questions are unique"
    for r in rows:
        assert set(r) == {"id", "question", "pages", "keywords", "note", "split", "answerable"}
        assert r["split"] in {"dev", "test"}, r["id"]
        assert isinstance(r["answerable"], bool), r["id"]
        assert r["note"].strip() and "\n" not in r["note"], r["id"]
        if not r["answerable"]:
            assert r["pages"] == [] and r["keywords"] == [], r["id"]
    splits = {s: [r for r in rows if r["split"] == s] for s in ("dev", "test")}
    for split, chosen in splits.items():
        assert len(chosen) == per_split, split
        assert sum(not r["answerable"] for r in chosen) == n_unanswerable // 2, split
    # The halves never share a question.
    dev_q = {r["question"].strip().lower() for r in splits["dev"]}
    assert not dev_q & {r["question"].strip().lower() for r in splits["test"]}

    questions = load_questions(PROJECT_ROOT / "evals" / "data" / name)  # validates the shapes
    assert [q.split for q in questions] == [r["split"] for r in rows]
    for q in questions:
        if not q.answerable:
            assert q.pages == () and q.keywords == (), q.id
            continue
        assert 1 <= len(q.pages) <= 3 and len(set(q.pages)) == len(q.pages), q.id
        assert all(not p.startswith("/") for p in q.pages), q.id
        assert 2 <= len(q.keywords) <= 3, q.id
        assert all(a == a.lower() for g in q.keywords for a in g), q.id
        assert keywords_ok(" ".join(g[0] for g in q.keywords), q.keywords), q.id


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(SPLIT_FILES))
def test_split_question_pages_exist_and_hold_every_keyword_group(name, shared_data):
    docs = shared_data / SPLIT_FILES[name][0]
    if not docs.is_dir():
        pytest.skip(f"{docs} is absent")
    for q in load_questions(PROJECT_ROOT / "evals" / "data" / name):
        texts = []
        for page in q.pages:
            path = docs / page
            assert path.is_file(), f"{q.id}: {page} is not under {docs}"
            texts.append(path.read_text(encoding="utf-8"))
        if not q.answerable:
            continue
        # Every group occurs in one of the pages, and the first (best) page holds one group.
        assert all(keywords_found("\n".join(texts), q.keywords)), q.id
        assert any(keywords_found(texts[0], q.keywords)), q.id


@pytest.mark.parametrize("name", sorted(SPLIT_FILES))
def test_perfect_answers_and_refusals_on_a_split_file_score_one(name):
    path = PROJECT_ROOT / "evals" / "data" / name
    answers = {}
    for q in load_questions(path):
        if q.answerable:
            text = "Answer: " + "; ".join(g[0] for g in q.keywords) + "."
            answers[q.question] = answer(text, [f"/docs/{q.pages[0]}"], cited=[1])
        else:
            answers[q.question] = answer(REFUSAL, [], refused=True)
    _, n, n_unanswerable, per_split = SPLIT_FILES[name]
    for split, count in (("all", n), ("dev", per_split), ("test", per_split)):
        cfg = DocQAConfig.of(questions=str(path), split=split)
        out = evaluate_docqa(cfg, pipeline=ScriptedPipeline(answers), progress=False)
        m = out["metrics"]
        assert out["n_questions"] == count and out["config"]["split"] == split
        assert out["n_unanswerable"] == (n_unanswerable if split == "all" else n_unanswerable // 2)
        assert m["hit@k"] == m["keyword_rate"] == m["right_page_citation_rate"] == 1.0
        assert m["unanswerable_refusal_rate"] == 1.0 and m["false_refusal_rate"] == 0.0
        assert m["refusal_rate"] == pytest.approx(out["n_unanswerable"] / count, abs=1e-4)


# ---------------------------------------------------------------------------- unanswerable, splits


@pytest.fixture
def mixed_questions(tmp_path) -> Path:
    """Three answerable and two unanswerable questions over two splits."""
    rows = [
        {
            "id": "a",
            "question": "How do I stash some files?",
            "pages": ["git-stash.txt"],
            "keywords": [["git stash push"], ["pathspec"]],
            "note": "push",
            "split": "dev",
            "answerable": True,
        },
        {
            "id": "b",
            "question": "How do I rename a branch?",
            "pages": ["git-branch.txt"],
            "keywords": [["-m", "--move"], ["rename"]],
            "note": "-m",
            "split": "test",
            "answerable": True,
        },
        {
            "id": "c",
            "question": "What is the reflog?",
            "pages": ["git-reflog.txt"],
            "keywords": [["reflog"], ["tips"]],
            "note": "description",
            "split": "test",
        },  # answerable by default
        {
            "id": "u1",
            "question": "How do I configure nginx?",
            "pages": [],
            "keywords": [],
            "note": "unrelated",
            "split": "dev",
            "answerable": False,
        },
        {
            "id": "u2",
            "question": "What does git commit --smart-split do?",
            "pages": [],
            "keywords": [],
            "note": "made up",
            "split": "test",
            "answerable": False,
        },
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


GIT = "/data/git-doc"


def _mixed_pipeline() -> ScriptedPipeline:
    return ScriptedPipeline(
        {
            # right page first, keywords, right citation
            "How do I stash some files?": answer(
                "Use git stash push with a pathspec.", [f"{GIT}/git-stash.txt"], cited=[1]
            ),
            # right page second, a keyword group missing, cites the wrong page
            "How do I rename a branch?": answer(
                "Use git branch.", [f"{GIT}/git-log.txt", f"{GIT}/git-branch.txt"], cited=[1]
            ),
            # an answerable question refused: a false refusal
            "What is the reflog?": answer(REFUSAL, [], refused=True),
            # unanswerable and refused: right
            "How do I configure nginx?": answer(REFUSAL, [], refused=True),
            # unanswerable but answered (with a citation and every keyword of b): wrong, and it
            # must not count as a hit, keyword or right-page citation of anything
            "What does git commit --smart-split do?": answer(
                "Rename it with git branch -m; it uses the reflog tips.",
                [f"{GIT}/git-branch.txt", f"{GIT}/git-reflog.txt"],
                cited=[1, 2],
            ),
        }
    )


def test_unanswerable_questions_leave_the_answer_rates_and_get_their_own(mixed_questions):
    out = evaluate_docqa(
        DocQAConfig.of(questions=str(mixed_questions)), pipeline=_mixed_pipeline(), progress=False
    )
    m = out["metrics"]
    assert out["n_questions"] == 5 and out["n_unanswerable"] == 2
    # over the 3 answerable questions (over all 5 these would read 0.4, 0.3, 0.2, 0.2, 0.2)
    assert m["hit@k"] == pytest.approx(0.6667)
    assert m["mrr@k"] == pytest.approx(0.5)  # (1 + 1/2 + 0) / 3
    assert m["keyword_rate"] == pytest.approx(0.3333)
    assert m["right_page_citation_rate"] == pytest.approx(0.3333)
    assert m["false_refusal_rate"] == pytest.approx(0.3333)
    # over the 2 unanswerable questions
    assert m["unanswerable_refusal_rate"] == pytest.approx(0.5)
    # behaviour over all 5
    assert m["refusal_rate"] == pytest.approx(0.4)
    assert m["citation_rate"] == pytest.approx(0.6)
    u2 = out["predictions"][4]
    assert u2["answerable"] is False and u2["split"] == "test" and u2["cited"]
    assert not u2["hit"] and not u2["keywords_ok"] and not u2["cites_right_page"]
    assert u2["keywords_found"] == [] and u2["hit_rank"] is None
    assert out["predictions"][2]["answerable"] is True  # the default


def test_split_picks_the_questions_and_the_rates_follow(mixed_questions):
    def run(split: str, **kw) -> dict:
        cfg = DocQAConfig.of(questions=str(mixed_questions), split=split, **kw)
        return evaluate_docqa(cfg, pipeline=_mixed_pipeline(), progress=False)

    dev = run("dev")
    assert [r["id"] for r in dev["predictions"]] == ["a", "u1"] and dev["n_unanswerable"] == 1
    assert dev["metrics"]["hit@k"] == dev["metrics"]["keyword_rate"] == 1.0
    assert dev["metrics"]["false_refusal_rate"] == 0.0
    assert dev["metrics"]["unanswerable_refusal_rate"] == 1.0
    assert dev["metrics"]["refusal_rate"] == pytest.approx(0.5)

    test = run("test")
    assert [r["id"] for r in test["predictions"]] == ["b", "c", "u2"]
    m = test["metrics"]
    assert m["hit@k"] == pytest.approx(0.5) and m["mrr@k"] == pytest.approx(0.25)
    assert m["keyword_rate"] == 0.0 and m["right_page_citation_rate"] == 0.0
    assert m["false_refusal_rate"] == pytest.approx(0.5)
    assert m["unanswerable_refusal_rate"] == 0.0

    # --limit counts within the split
    assert [r["id"] for r in run("test", limit=1)["predictions"]] == ["b"]


def test_rates_without_answerable_or_unanswerable_questions(mixed_questions, small_questions):
    out = evaluate_docqa(
        DocQAConfig.of(questions=str(mixed_questions)), pipeline=_mixed_pipeline(), progress=False
    )
    only_unanswerable = [r for r in out["predictions"] if not r["answerable"]]
    m = summarize(only_unanswerable)
    assert m["hit@k"] is None and m["mrr@k"] is None and m["keyword_rate"] is None
    assert m["right_page_citation_rate"] is None and m["false_refusal_rate"] is None
    assert m["unanswerable_refusal_rate"] == pytest.approx(0.5)
    # rows without the field (results written before it existed) count as answerable
    legacy = [
        {k: v for k, v in r.items() if k != "answerable"}
        for r in out["predictions"]
        if r["answerable"]
    ]
    assert summarize(legacy)["hit@k"] == pytest.approx(0.6667, abs=1e-4)
    assert summarize(legacy)["unanswerable_refusal_rate"] is None

    # a file without split fields is all "test"
    qs = load_questions(small_questions)
    assert {q.split for q in qs} == {"test"} and all(q.answerable for q in qs)
    assert select_split(qs, "test") == qs and select_split(qs, "dev") == []
    with pytest.raises(ValueError, match="no questions in the 'dev' split"):
        evaluate_docqa(DocQAConfig.of(questions=str(small_questions), split="dev"), pipeline=None)
    with pytest.raises(ValueError, match="--split"):
        evaluate_docqa(DocQAConfig.of(questions=str(small_questions), split="train"), pipeline=None)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"split": "train"}, "split must be one of dev, test"),
        ({"answerable": "no"}, "answerable must be true or false"),
        ({"answerable": False}, "an unanswerable question has no pages and no keywords"),
        ({"answerable": False, "pages": []}, "an unanswerable question has no pages"),
    ],
)
def test_bad_split_and_answerable_fields_are_rejected(tmp_path, extra, message):
    row = {"id": "x", "question": "q", "pages": ["a.txt"], "keywords": [["a"], ["b"]], **extra}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl:1: {message}"):
        load_questions(path)


def test_cli_split_flag(mixed_questions, tmp_path, monkeypatch, capsys):
    import evals.docqa as docqa

    monkeypatch.setattr(docqa, "build_pipeline", lambda cfg: _mixed_pipeline())
    out = tmp_path / "docqa.json"
    argv = ["--questions", str(mixed_questions), "--split", "test", "--out", str(out)]
    assert docqa.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["config"]["split"] == "test" and result["n_questions"] == 3
    err = capsys.readouterr().err
    assert "unanswerable refused 0.000" in err and "3 questions, test split" in err

    with pytest.raises(SystemExit) as exc:  # argparse choices: stops at parse time
        docqa.main(["--questions", str(mixed_questions), "--split", "train"])
    assert exc.value.code == 2
    assert "--split: invalid choice: 'train'" in capsys.readouterr().err
