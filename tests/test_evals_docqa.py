"""Documentation QA eval end to end with scripted pipelines (no models), through the real
pipeline, and its CLI. The metrics and the question file: test_evals_docqa_scoring.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from docqa_support import DOCS, QUESTIONS_FILE, answer, hit

from evals.docqa import DocQAConfig, evaluate_docqa, load_questions
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.prompt import REFUSAL
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
