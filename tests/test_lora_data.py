"""Grounded-QA training data at scale: SQuAD examples (refusals, citations, balanced gold
positions, no held-out text) and documentation examples mined from a folder (heading → question,
section lead → cited answer, markup cleaned), plus their mix and the lora_data CLI."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest

from rag.answer.prompt import REFUSAL, parse_citations
from rag.evaluation.datasets import load_squad_paragraphs, squad_split
from training.data.doc_markup import clean_inline
from training.data.doc_qa_data import doc_examples
from training.data.doc_questions import make_question
from training.data.lora_data import (
    assert_no_heldout,
    build_examples,
    main,
    read_examples,
    squad_examples,
    training_examples,
)

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
# What a cleaned target must never contain outside `code`: roles, double-backtick literals,
# directives, strong emphasis, link/reference endings, substitutions.
MARKUP = re.compile(r":\w+:`|``|(^|\s)\.\. |\*\*|`_|>`|\|\w+\|")


def has_markup(text: str) -> bool:
    return MARKUP.search(re.sub(r"`[^`]+`", "", text)) is not None


WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def write_squad(path: Path, n_articles: int = 12, n_paras: int = 5, n_q: int = 5) -> Path:
    """SQuAD-shaped JSON with distinct answers per question; the first article is ``Normans``,
    which is held out (it is in SQUAD_DEV_ARTICLES)."""
    data = []
    for a in range(n_articles):
        title = "Normans" if a == 0 else f"Topic_{a}"
        paragraphs = []
        for p in range(n_paras):
            facts = [f"The {WORDS[(a + p + q) % len(WORDS)]} code of {title} part {p} item {q}"
                     f" is ans{a}x{p}x{q}." for q in range(n_q)]  # fmt: skip
            qas = [
                {
                    "id": f"{a}-{p}-{q}",
                    "question": f"What is the {WORDS[(a + p + q) % len(WORDS)]} code of "
                    f"{title} part {p} item {q}?",
                    "answers": [{"text": f"ans{a}x{p}x{q}"}],
                }
                for q in range(n_q)
            ]
            paragraphs.append({"context": " ".join(facts), "qas": qas})
        data.append({"title": title, "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


@pytest.fixture(scope="module")
def squad(tmp_path_factory) -> Path:
    return write_squad(tmp_path_factory.mktemp("squad") / "squad.json")


@pytest.fixture(scope="module")
def rst_docs(tmp_path_factory) -> Path:
    """Three small files; ``tools.rst`` has every kind of markup the lead cleaner must remove."""
    root = tmp_path_factory.mktemp("docs")
    (root / "tools.rst").write_text(
        ":mod:`spool` --- Spooling files\n================================\n\n"
        ".. module:: spool\n   :synopsis: Spooling files.\n\n"
        "**Source code:** :source:`Lib/spool.py`\n\n--------------\n\n"
        "The :mod:`spool` module writes **large** outputs to :func:`~io.open` files, see\n"
        "`the guide <https://example.org>`_ and ``spool.flush()``\\ s. It keeps *one* buffer\n"
        "per :class:`Writer <spool.Writer>` [#]_.\n\n"
        ".. note::\n\n   Buffers are not thread safe.\n\n"
        "Installing spools\n-----------------\n\n"
        "Example::\n\n    pip install spool\n\n"
        "Run the installer once per machine, then restart the shell so that the new path is\n"
        "found. The installer never changes system files.\n"
    )
    (root / "cooking.md").write_text(
        "# Cooking\n\nCooking turns raw food into meals by heating it in a pan or an oven for a"
        " while.\n\n## Baking bread\n\nBread is baked from flour, water, salt and yeast in a hot"
        " oven until the crust is brown and the loaf sounds hollow.\n"
    )
    (root / "garden.md").write_text(
        "# Gardening\n\nA garden needs light, water and good soil; most vegetables want six hours"
        " of sun a day and soil that drains well after rain.\n\n## Compost\n\nCompost is made"
        " from kitchen scraps and leaves that rot in a heap for a few months before use.\n"
    )
    return root


# ---------------------------------------------------------------------------- SQuAD examples


def test_refusals_hold_no_gold_passage_and_target_the_refusal(squad):
    ex = squad_examples(squad, "train", n=200, k=3, refusal_fraction=0.25, seed=3)
    gold_of = {q.id: p.id for p in load_squad_paragraphs(squad) for q in p.questions}
    refusals = [e for e in ex if not e.answerable]
    assert len(ex) == 200 and len(refusals) == 50  # exactly round(n * fraction)
    for e in refusals:
        assert e.target == REFUSAL and e.cited == [] and len(e.passages) == 3
        assert gold_of[e.id] not in e.passage_ids
        assert not any(e.answers[0] in p for p in e.passages)


def test_citations_point_at_the_passage_holding_the_answer(squad):
    ex = squad_examples(squad, "train", n=0, k=4, refusal_fraction=0.1, seed=1)
    gold_of = {q.id: p.id for p in load_squad_paragraphs(squad) for q in p.questions}
    answerable = [e for e in ex if e.answerable]
    assert len(ex) == 11 * 5 * 5  # n=0: every train question
    for e in answerable:
        (n,) = e.cited
        assert e.passage_ids[n - 1] == gold_of[e.id] and e.answers[0] in e.passages[n - 1]
        assert sum(e.answers[0] in p for p in e.passages) == 1
        parsed = parse_citations(e.target, len(e.passages))
        assert parsed.cited == [n] and parsed.text == e.answers[0]


@pytest.mark.parametrize("k", [2, 3, 5])
def test_gold_position_is_spread_over_all_k(squad, k):
    ex = squad_examples(squad, "train", n=0, k=k, refusal_fraction=0.15, seed=k)
    counts = Counter(e.cited[0] for e in ex if e.answerable)
    n = sum(counts.values())
    assert set(counts) == set(range(1, k + 1))
    assert all(0.7 * n / k <= c <= 1.3 * n / k for c in counts.values()), counts
    # and across seeds one example's position is not stuck
    firsts = {build_examples(load_squad_paragraphs(squad), ["Topic_3"], 1, k, 0.0, s)[0].cited[0]
              for s in range(40)}  # fmt: skip
    assert firsts == set(range(1, k + 1))


def test_train_examples_never_use_heldout_articles(squad):
    train, dev = squad_split(squad)
    assert dev == ["Normans"]
    paragraphs = load_squad_paragraphs(squad)
    ex = training_examples([str(squad)], n=0, k=3, seed=2)
    assert_no_heldout(ex, dev, paragraphs)  # raises on any held-out question or passage
    assert not any(e.article == "Normans" or "Normans" in " ".join(e.passage_ids) for e in ex)
    heldout = squad_examples(squad, "dev", n=10, k=3)
    with pytest.raises(AssertionError):
        assert_no_heldout(heldout, dev, paragraphs)


# ---------------------------------------------------------------------------- doc examples


def test_clean_inline_removes_rst_and_markdown_markup():
    rst = (
        "Use :func:`~io.open` or :meth:`Path.open <pathlib.Path.open>` on ``__init__.py``\\ s,"
        " see `docs <https://x>`_, |version| and :pep:`8` [#]_ with **care** and *style*::"
    )
    assert clean_inline(rst) == (
        "Use open or Path.open on `__init__.py`s, see docs, version and PEP 8 with care and style:"
    )
    md = "Run `__main__.py` via [the CLI](https://x) ![logo](a.png) with **force** and _care_."
    assert clean_inline(md, rst=False) == "Run `__main__.py` via the CLI with force and care."


def test_question_templates():
    assert make_question(("FAQ", "How do I copy a file?")) == ("How do I copy a file?", "")
    assert make_question((":mod:`os.path` --- Common pathname manipulations",)) == (
        "What is the os.path module?",
        "os.path",
    )
    assert make_question(("Guide", "Installing Packages"))[0] == "How do I install packages?"
    assert make_question(("Guide", "Binary Data Services"))[0] == "What are binary data services?"
    assert make_question(("Guide", "PEP 405: Virtual Environments"))[0] == "What is PEP 405?"
    assert make_question(("Python basics", "Examples"))[0] == (
        'What does the "Examples" section of Python basics cover?'
    )
    assert make_question(("A", "socket"), unique=False)[0] == (
        'What does the "socket" section of A cover?'
    )


def test_doc_examples_cite_the_gold_section_in_clean_text(rst_docs):
    ex = doc_examples([rst_docs], n=0, k=2, refusal_fraction=0.0, seed=0)
    by_q = {e.question: e for e in ex}
    spool = by_q["What is the spool module?"]
    assert spool.target.startswith(
        "The spool module writes large outputs to open files, see the guide and"
        " `spool.flush()`s. It keeps one buffer per Writer."
    )
    install = by_q["How do I install spools?"]  # "Example::" and its literal block are skipped
    assert install.answers[0].startswith("Run the installer once per machine")
    for e in ex:
        (n,) = e.cited
        gold_file = e.id.split("#")[0]
        assert e.kind == "doc" and e.passage_ids[n - 1] == e.id
        assert e.target == f"{e.answers[0]} [{n}]" and not has_markup(e.target)
        assert all(p.split("#")[0] != gold_file for p in e.passage_ids if p != e.id)
        # the answer is extractive: its words are the gold passage's, in its first sentences
        gold = e.passages[n - 1]
        first = re.sub(r"[`*]", "", e.answers[0].split()[0])
        assert first in gold and len(gold.split()) <= 180


def test_doc_examples_on_fixture_corpus(tmp_path):
    ex = doc_examples([CORPUS], n=0, k=3, refusal_fraction=0.2, seed=4)
    refusals = [e for e in ex if not e.answerable]
    assert len(ex) >= 25 and len(refusals) == round(len(ex) * 0.2)
    for e in refusals:  # gold removed: no passage from its section or its file
        assert e.target == REFUSAL and e.id not in e.passage_ids and len(e.passages) == 3
        assert all(p.split("#")[0] != e.id.split("#")[0] for p in e.passage_ids)
    answerable = [e for e in ex if e.answerable]
    counts = Counter(e.cited[0] for e in answerable)
    assert set(counts) == {1, 2, 3} and max(counts.values()) - min(counts.values()) <= 1
    for e in answerable:
        assert e.passage_ids[e.cited[0] - 1] == e.id and not has_markup(e.target)
        assert parse_citations(e.target, 3).cited == e.cited
    assert ex == doc_examples([CORPUS], n=0, k=3, refusal_fraction=0.2, seed=4)  # deterministic
    assert len(doc_examples([CORPUS], n=7, k=3, seed=4)) == 7


def test_training_mix_and_cli(squad, tmp_path):
    mix = training_examples([str(squad)], [str(CORPUS)], n=40, doc_fraction=0.25, k=3, seed=0)
    kinds = Counter(e.kind for e in mix)
    assert kinds == {"squad": 30, "doc": 10}
    assert Counter(e.kind for e in training_examples([], [str(CORPUS)], n=12)) == {"doc": 12}
    with pytest.raises(ValueError, match="--data or --docs"):
        training_examples([], [], n=10)

    out = tmp_path / "mix.jsonl"
    argv = ["--squad", str(squad), "--docs", str(CORPUS), "--n", "20", "--doc-fraction", "0.5"]
    assert main([*argv, "--k", "3", "--out", str(out)]) == 0
    rows = read_examples(out)
    assert len(rows) == 20 and Counter(e.kind for e in rows) == {"squad": 10, "doc": 10}
    bad = ["--squad", str(squad), "--docs", str(CORPUS), "--split", "dev", "--out", str(out)]
    assert main(bad) == 2


# ---------------------------------------------------------------------------- real data


@pytest.mark.data
def test_real_squad_and_python_docs_build_fast(shared_data):
    squad_file = shared_data / "squad" / "squad-v1.1-dev-part.json"
    t0 = time.time()
    ex = squad_examples(squad_file, "train", n=3000, k=3, refusal_fraction=0.15)
    assert len(ex) == 3000 and time.time() - t0 < 60
    assert sum(not e.answerable for e in ex) == 450
    docs = doc_examples([shared_data / "python-docs"], n=300, k=3, seed=0)
    assert len(docs) == 300
    for e in docs:
        assert not has_markup(e.target)
        if e.answerable:
            assert e.passage_ids[e.cited[0] - 1] == e.id


# ---------------------------------------------------------------------------- fixed-seed outputs


def write_sparse_squad(path: Path) -> Path:
    """SQuAD-shaped JSON whose paragraphs share no content word with another paragraph's
    question: BM25 finds only the gold, so every distractor comes from the random top-up."""
    data = [
        {
            "title": f"Sparse_{a}",
            "paragraphs": [
                {
                    "context": f"Keyword{a}q{p} stands for ans{a}y{p} in the sparse test set.",
                    "qas": [
                        {
                            "id": f"s{a}-{p}",
                            "question": f"Which keyword{a}q{p}?",
                            "answers": [{"text": f"ans{a}y{p}"}],
                        }
                    ],
                }
                for p in range(3)
            ],
        }
        for a in range(5)
    ]
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


def _digest(examples, root: Path | None = None) -> str:
    """sha256 (16 hex digits) of the examples as JSON, ``root`` (a tmp folder) written ROOT."""
    text = json.dumps([asdict(e) for e in examples], sort_keys=True)
    if root is not None:
        text = text.replace(str(root), "ROOT")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Digests of both builders' examples, computed before their shared distractor/gold loop
# (training.data.qa_example) replaced the two copies: the refactor changed no example, no draw.
SQUAD_DIGESTS = {
    ("squad", 1, 0.15, 0, 0): "ebd087512472dfc3",
    ("squad", 3, 0.15, 0, 0): "2ab2987b4e82d294",
    ("squad", 4, 0.5, 8, 7): "80a28b41763bb6d8",
    ("sparse", 1, 0.0, 0, 0): "4ca7a1da4dd2af5c",
    ("sparse", 3, 0.2, 0, 1): "cc5ef841cbe4b671",
    ("sparse", 4, 0.5, 5, 2): "8004403385497611",
}
DOC_DIGESTS = {
    ("corpus", 3, 0.2, 180, 4): "155004353031d4b7",
    ("corpus", 5, 0.15, 40, 0): "bcf41af6ece70e49",
    ("rst", 2, 0.0, 180, 0): "e385fadca7eb0eff",
    ("rst", 4, 0.3, 180, 3): "2667b882aaba71a4",
}


def test_builders_give_the_same_examples_for_a_fixed_seed(squad, rst_docs, tmp_path):
    sources = {"squad": squad, "sparse": write_sparse_squad(tmp_path / "sparse.json")}
    for (name, k, refusal, words, seed), digest in SQUAD_DIGESTS.items():
        paragraphs = load_squad_paragraphs(sources[name])
        articles = sorted({p.title for p in paragraphs})
        ex = build_examples(paragraphs, articles, 0, k, refusal, seed, passage_words=words)
        assert _digest(ex) == digest, (name, k, refusal, words, seed)
    roots = {"corpus": CORPUS, "rst": rst_docs}
    for (name, k, refusal, words, seed), digest in DOC_DIGESTS.items():
        ex = doc_examples([roots[name]], 0, k, refusal, seed, words)
        assert _digest(ex, roots[name]) == digest, (name, k, refusal, words, seed)
