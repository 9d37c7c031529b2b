"""QA eval: passage assembly, scoring and summaries, with a scripted generator."""

from __future__ import annotations

import json
import re

import pytest

from evals.qa import OraclePassages, QAEvalConfig, evaluate_qa, holds_answer, select_questions
from rag.evaluation.datasets import DatasetError, load_squad_paragraphs

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange"]


@pytest.fixture
def squad(tmp_path):
    data = {"data": []}
    for a, title in enumerate(["Paints", "Flags"]):
        paras = []
        for i, colour in enumerate(COLOURS[a * 3 : a * 3 + 3]):
            qid = f"{title}{i}"
            paras.append(
                {
                    "context": f"The {title.lower()} number {i} is painted {colour} all over, a {colour} {title.lower()}.",
                    "qas": [
                        {
                            "id": qid,
                            "question": f"What colour is {title.lower()} number {i}?",
                            "answers": [{"text": colour}, {"text": f"{colour} all over"}],
                        }
                    ],
                }
            )
        data["data"].append({"title": title, "paragraphs": paras})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    return path


class ScriptedGenerator:
    """Answers with the colour of the passage that mentions the asked number and title (correct),
    citing it; refuses when ``refuse`` is set."""

    def __init__(self, refuse=False, cite_all=False):
        self.refuse, self.cite_all, self.seen = refuse, cite_all, []

    def fit_passages(self, question, passages, max_new_tokens=32):
        return list(passages)

    def stream(self, messages, **kw):  # one body with generate, as the engines have
        yield self.generate(messages, **kw)

    def generate(self, messages, max_new_tokens=32, **kwargs):
        user = messages[-1]["content"]
        self.seen.append(user)
        if self.refuse:
            return "The documents do not contain the answer."
        q = re.search(r"What colour is (\w+) number (\d)", user)
        for num, text in re.findall(r"\[(\d)\] (.*)", user):
            if f"{q.group(1)} number {q.group(2)} " in text:
                colour = re.search(r"painted (\w+)", text).group(1)
                cites = "[1][2][3]" if self.cite_all else f"[{num}]"
                return f"The {colour.capitalize()}. {cites}"
        return "no idea"


def test_holds_answer_uses_normalised_whole_words():
    assert holds_answer("It is painted Red, mostly.", ["red"])
    assert not holds_answer("It is painted reddish.", ["red"])
    assert not holds_answer("anything", [""])


def test_select_questions_sample_is_seeded_and_errors_name_articles(squad):
    paras = load_squad_paragraphs(squad)
    a = select_questions(paras, ["Paints", "Flags"], limit=4, seed=1)
    assert [q.id for q in a] == [q.id for q in select_questions(paras, ["Paints", "Flags"], 4, 1)]
    assert len(a) == 4
    with pytest.raises(DatasetError, match="Nope"):
        select_questions(paras, ["Nope"], 0, 0)


def test_oracle_passages_hold_gold_once_and_k_total(squad):
    paras = load_squad_paragraphs(squad)
    q = select_questions(paras, ["Paints"], 0, 0)[0]
    got = OraclePassages(paras, k=3, seed=0)(q)
    ids = [d for d, _ in got]
    assert len(ids) == 3 and len(set(ids)) == 3 and ids.count(q.paragraph) == 1


def test_perfect_reader_scores_one(squad):
    gen = ScriptedGenerator()
    cfg = QAEvalConfig.of(
        squad=str(squad), articles=["Paints", "Flags"], mode="oracle", k=3, limit=0
    )
    out = evaluate_qa(cfg, generator=gen, progress=False)
    m = out["metrics"]
    assert out["n_questions"] == 6
    assert m["em"] == 1.0 and m["f1"] == 1.0 and m["citation_accuracy"] == 1.0
    assert m["refusal_rate"] == 0.0 and m["answer_in_context"] == 1.0
    # The gold passage is not always first: the order is shuffled per question.
    assert len({p["gold_passages"][0] for p in out["predictions"]}) > 1


def test_over_citing_and_refusing_are_penalised(squad):
    cfg = QAEvalConfig.of(squad=str(squad), articles=["Paints"], mode="oracle", k=3, limit=0)
    over = evaluate_qa(cfg, generator=ScriptedGenerator(cite_all=True), progress=False)["metrics"]
    assert over["em"] == 1.0 and over["citation_accuracy"] == 0.0
    refuse = evaluate_qa(cfg, generator=ScriptedGenerator(refuse=True), progress=False)["metrics"]
    assert (
        refuse["refusal_rate"] == 1.0 and refuse["em"] == 0.0 and refuse["citation_accuracy"] == 0.0
    )


def test_default_articles_are_the_fixed_dev_split(squad):
    cfg = QAEvalConfig.of(squad=str(squad), mode="oracle", k=2, limit=0)
    out = evaluate_qa(cfg, generator=ScriptedGenerator(), progress=False)
    assert out["config"]["articles"] == ["Flags"]  # every fifth title of a file without dev titles


def test_bad_mode_is_rejected(squad):
    with pytest.raises(ValueError, match="--mode"):
        evaluate_qa(QAEvalConfig.of(squad=str(squad), mode="closed"), generator=ScriptedGenerator())


def test_rag_mode_runs_through_the_pipeline(squad):
    cfg = QAEvalConfig.of(
        squad=str(squad), articles=["Paints", "Flags"], mode="rag", retriever="bm25", k=2, limit=0
    )
    out = evaluate_qa(cfg, generator=ScriptedGenerator(), progress=False)
    rows = out["predictions"]
    assert len(rows) == 6 and all(len(r["passages"]) <= 2 for r in rows)
    # Where retrieval found the asked paragraph the scripted reader answers and cites it.
    found = [
        r
        for r in rows
        if r["id"][-1] in "012"
        and any(p.endswith("/" + r["id"][-1]) and p.startswith(r["id"][:-1]) for p in r["passages"])
    ]
    assert found and all(r["em"] == 1.0 and r["citation_correct"] for r in found)
    assert out["metrics"]["answer_in_context"] == pytest.approx(
        len([r for r in rows if r["gold_passages"]]) / 6, abs=1e-4
    )


def test_cli_flags_come_from_the_config_and_errors_name_them(squad, tmp_path, capsys):
    from evals.qa import main

    with pytest.raises(SystemExit) as e:
        main(["--generator", "smollm2"])
    assert e.value.code == 2 and "--squad" in capsys.readouterr().err
    assert main(["--squad", str(squad), "--mode", "closed-book"]) == 2
    assert "--mode must be oracle or rag, not 'closed-book'" in capsys.readouterr().err
    assert main(["--squad", str(tmp_path / "missing.json"), "--limit", "3"]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert "--max-new-tokens" in _help(main)  # one kebab-case flag per config field, with help


def _help(main) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main(["--help"])
    return buf.getvalue()


class RefusingWhenAbsent(ScriptedGenerator):
    """The scripted reader, refusing instead of "no idea" when no passage answers."""

    def generate(self, messages, max_new_tokens=32, **kwargs):
        out = super().generate(messages, max_new_tokens)
        return "The documents do not contain the answer." if out == "no idea" else out


def test_removed_articles_are_out_of_the_index_and_their_questions_score_refusals(squad):
    from evals.qa import removed_articles

    assert removed_articles(["A", "B", "C"], 1, 0) == removed_articles(["C", "B", "A"], 1, 0)
    with pytest.raises(ValueError, match="--removed-articles"):
        removed_articles(["A", "B"], 2, 0)
    cfg = QAEvalConfig.of(
        squad=str(squad),
        articles=["Paints", "Flags"],
        mode="rag",
        retriever="bm25",
        k=2,
        limit=0,
        removed_articles=1,
        unanswerable_limit=10,
    )
    out = evaluate_qa(cfg, generator=RefusingWhenAbsent(), progress=False)
    (gone,) = out["config"]["removed"]
    rows = out["predictions"]
    unanswerable = [r for r in rows if not r["answerable"]]
    assert len(unanswerable) == 3 and all(r["id"].startswith(gone) for r in unanswerable)
    assert not any(p.startswith(gone + "/") for r in rows for p in r["passages"])
    m = out["metrics"]
    assert m["refusal_rate_unanswerable"] == 1.0 and m["false_refusal_rate"] == 0.0
    answerable = [r for r in rows if r["answerable"]]
    assert m["em"] > 0 and m["em"] == pytest.approx(sum(r["em"] for r in answerable) / 3, abs=1e-4)
    with pytest.raises(ValueError, match="needs --mode rag"):
        evaluate_qa(
            QAEvalConfig.of(squad=str(squad), articles=["Paints", "Flags"], removed_articles=1),
            generator=RefusingWhenAbsent(),
            progress=False,
        )
