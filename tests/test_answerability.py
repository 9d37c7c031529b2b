"""The answerability check (rag.answer.answerability): IDF coverage, the dense signal, the decision, the
pipeline refusing before decoding, and its fit/measure eval (evals.answerability)."""

from __future__ import annotations

import json

import pytest
from ingest_support import write_docs
from test_evals_qa import squad  # noqa: F401  (fixture: a two-article SQuAD file)
from test_pipeline import FakeGenerator

from evals.answerability import AnswerabilityEvalConfig, fit, pick_threshold, rates, signals
from rag.answer.answerability import (
    DEFAULT_MODEL,
    AnswerabilityModel,
    asked_sentences,
    best_dense,
    check,
    coverage,
    decide,
    literal_terms,
    named_acronyms,
    named_places,
    refusal_text,
    unmentioned,
)
from rag.answer.prompt import REFUSAL
from rag.config import ConfigError, RAGConfig
from rag.ingest import ingest
from rag.pipeline import RAGPipeline
from rag.retrieval.bm25 import BM25Index, terms
from rag.retrieval.mentions import CorpusText
from rag.retrieval.retriever import CorpusRetriever, FusedHit, Retriever
from rag.retrieval.settings import RetrievalSettings
from rag.types import Chunk, Hit
from ui.render import reply_markdown

TEXTS = [
    "Python lists are mutable sequences of items.",
    "A tuple is an immutable sequence; lists are not.",
    "The with statement calls __enter__ and __exit__ of a context manager.",
]


def test_idf_gives_unknown_terms_the_largest_weight():
    bm = BM25Index(["a", "b", "c"], TEXTS)
    idf = bm.idf(terms(["lists tuple normans"])[0])
    assert idf["norman"] > idf["tupl"] > idf["list"] > 0  # df 0 > df 1 > df 2


def test_coverage_is_the_best_passage_share_of_query_idf():
    idf = {"rare": 3.0, "common": 1.0}
    assert coverage(["rare", "common"], [["common"], ["rare", "x"]], idf) == pytest.approx(0.75)
    assert coverage(["rare", "common"], [["rare", "common"]], idf) == 1.0
    assert coverage([], [["rare"]], idf) == 0.0 and coverage(["rare"], [], idf) == 0.0


def test_best_dense_reads_fused_and_dense_hits_only():
    c = Chunk("id", "t", "f.md", (), 0, 1)
    assert (
        best_dense([FusedHit(c, 0.1, 1, "hybrid", dense_score=0.4), Hit(c, 0.7, 2, "dense")]) == 0.7
    )
    assert best_dense([Hit(c, 5.0, 1, "bm25"), FusedHit(c, 0.2, 2, "hybrid")]) is None


def test_probability_falls_as_either_signal_rises():
    m = DEFAULT_MODEL
    assert m.probability(0.2, 0.2) > m.probability(0.6, 0.2) > m.probability(0.6, 0.9)
    assert decide(m, 0.2, 0.1).refuse and not decide(m, 0.7, 0.9).refuse
    assert not decide(m, 0.2, 0.1, threshold=1.0).refuse  # a threshold override wins


class CoverageRetriever:
    """Fused hits with a fixed dense score; coverage computed over the hits' texts."""

    def __init__(self, dense: float):
        corpus = CorpusRetriever(["a", "b", "c"], TEXTS, None, RetrievalSettings(mode="bm25"))
        self.engine, self.mentions = corpus.engine, corpus.mentions
        self.dense = dense

    def search(self, query, k=5, mode="hybrid"):
        self.queries = [*getattr(self, "queries", []), query]
        return [
            FusedHit(Chunk(i, t, f"{i}.md", (), 0, 1), 0.5, n, "hybrid", self.dense, 1.0)
            for n, (i, t) in enumerate(zip("abc", TEXTS), start=1)
        ][:k]

    def coverage(self, query, hits):
        return self.engine.coverage(query, [h.chunk.text for h in hits])


def _ask(question: str, dense: float, **cfg) -> tuple:
    gen = FakeGenerator("Lists are mutable [1].")
    pipe = RAGPipeline(RAGConfig.of(**cfg), retriever=CoverageRetriever(dense), generator=gen)
    return pipe.answer(question), gen


def test_pipeline_refuses_unanswerable_questions_without_decoding():
    answer, gen = _ask("Who ruled the Normans in 1066?", dense=0.15)
    assert answer.refused and answer.text == REFUSAL and not gen.calls
    assert len(answer.passages) == 3 and not answer.citations  # the passages are still shown
    assert answer.unanswerable_probability > DEFAULT_MODEL.threshold


def test_pipeline_answers_answerable_questions_and_records_the_probability():
    answer, gen = _ask("Are Python lists mutable?", dense=0.7)
    assert not answer.refused and len(gen.calls) == 1 and answer.citations[0].number == 1
    assert answer.unanswerable_probability < DEFAULT_MODEL.threshold
    off, gen = _ask("Who ruled the Normans in 1066?", dense=0.15, answerability_threshold=None)
    assert not off.refused and off.unanswerable_probability is None and gen.calls
    with pytest.raises(ConfigError, match="--answerability-threshold"):
        RAGConfig.of(answerability_threshold=1.5)


def test_check_is_off_without_signals():
    r = CoverageRetriever(0.5)
    c = Chunk("a", TEXTS[0], "a.md", (), 0, 1)
    assert check(r, "lists", [Hit(c, 3.0, 1, "bm25")], 0.5) is None  # no dense score
    assert check(object(), "lists", r.search("lists"), 0.5) is None  # no coverage method
    assert check(r, "lists", r.search("lists"), None) is None  # switched off


@pytest.mark.parametrize(
    ("question", "terms"),
    [
        ("What does git commit --smart-split do?", ["--smart-split"]),
        ("Why use git push --force-with-lease instead of -f?", ["--force-with-lease", "-f"]),
        ("What does the vm.swap_boost_factor sysctl do?", ["vm.swap_boost_factor"]),
        ("What does the intel_turbo_unlock= boot parameter do?", ["intel_turbo_unlock"]),
        ("What are os.path.join and pr_debug?", ["os.path.join", "pr_debug"]),
        ("What does the pg_autotune_memory() function do?", ["pg_autotune_memory"]),
        ("How do I use `print()` with os.path.join()?", ["print", "os.path.join"]),
        # names the user's own data or asks no question about a name: not terms
        ("How do I sort my_list and call os.path.join?", []),
        ("How do I restore config.yaml or `feature/login` from HEAD?", []),
        ("What does `git checkout -b topic` do?", ["-b"]),
        ("What does the 'Squash and merge' button do?", ["Squash and merge"]),
        ('Is the "Auto save" settings tab gone?', ["Auto save"]),
        ("What do I set `Restart=` to?", ["Restart"]),
        # a quoted message is paraphrased from memory: not looked up
        ("I keep getting 'too many open files'. How do I raise the limit?", []),
        ('Who wrote "Walking in Fresno?"', []),
        # not terms: apostrophes, long quotations (a message quoted from memory), blanks,
        # abbreviations, hyphenated words, numbers
        ("I'm on my friend's branch. What's wrong?", []),
        ('What does "You are in a detached HEAD state now" mean?', []),
        ("Oxygen is used at _____ of the normal pressure, e.g. in the U.S.", []),
        ("Is a read-only re-run of Python 3.11 safe?", []),
    ],
)
def test_literal_terms_are_options_identifiers_and_short_quotes(question, terms):
    assert literal_terms(question) == terms


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("How do I decline a pull request in Bitbucket?", ["Bitbucket"]),
        ("How do I protect a branch in GitLab's project settings?", ["GitLab"]),
        ("How do I sync my index with Google Drive?", ["Google Drive"]),
        ("What is a generator in Python 3.12?", ["Python"]),
        # a capitalised name the question does not set its task in: the user's own code
        ("How do I make MyClass iterable?", []),
        ("Why does Git refuse to push?", []),
        # the platform a task runs on: the manual answers it without naming it
        ("How do I check my swap on Ubuntu?", []),
    ],
)
def test_named_places_are_what_a_question_sets_its_task_in(question, names):
    assert named_places(question) == names


def test_a_place_no_document_names_is_missing_a_misspelling_or_reordering_is_not():
    corpus = CorpusText(lambda: ["Tesla taught in Gospić.", "The Seven Years' War ended."])
    ask = lambda q: unmentioned(q, corpus.mentions)  # noqa: E731
    assert ask("How do I run it in Bitbucket?") == ["Bitbucket"]
    assert ask("Where did Tesla teach in Gospic?") == []  # accents aside
    assert ask("How long did the fighting last in Seven Years War?") == []  # each word held
    assert ask("How do I use --deep-freeze in Bitbucket?") == ["--deep-freeze", "Bitbucket"]


@pytest.mark.parametrize(
    ("question", "acronyms"),
    [
        ("How do I profile CUDA kernels on my GPU with Valgrind?", ["CUDA", "GPU"]),
        ("Is HTTP/2 supported, and HTTP/3?", ["HTTP"]),
        # not acronyms: a numeral, a constant's parts, a plural, a capitalised word, "I"
        ("What did Henry VIII do after World War II?", []),
        ("How do I raise MAX_SIZE for my APIs?", []),
        ("Can I use Git and I mean Git?", []),
    ],
)
def test_named_acronyms_are_whole_capital_tokens_not_numerals(question, acronyms):
    assert named_acronyms(question) == acronyms


def test_an_acronym_no_document_holds_is_missing_wherever_it_stands():
    corpus = CorpusText(lambda: ["Memcheck runs on the CPU; attach GDB with vgdb."])
    ask = lambda q: unmentioned(q, corpus.mentions)  # noqa: E731
    assert ask("How do I profile CUDA kernels with Memcheck?") == ["CUDA"]
    assert ask("How do I attach GDB to Memcheck on my CPU?") == []
    assert ask("What did Henry VIII say about the CPU?") == []  # a numeral is not looked up
    assert ask("Can I run it from WSL?") == ["WSL"]  # named once, not as a place again


def test_corpus_text_mentions_a_phrase_case_and_spacing_aside_never_across_chunks():
    calls = []

    def texts():
        calls.append(1)
        return ["Use git push --force-with-lease,\n  not   --Force.", "squash and", "merge"]

    corpus = CorpusText(texts)
    assert corpus.mentions([]) == [] and not calls  # built on the first look-up only
    got = corpus.mentions(["--FORCE-with-lease", "lease, not --force", "squash and merge"])
    assert got == [True, True, False]  # the last one spans two chunks
    corpus.mentions(["x"])
    assert len(calls) == 1  # built once


def test_a_term_no_document_holds_is_refused_and_named_without_decoding():
    # dense and coverage alone would answer: "lists", "mutable" are in the passages
    answer, gen = _ask("Are Python lists mutable with --deep-freeze?", dense=0.7)
    assert answer.refused and not gen.calls
    assert answer.text == f"{REFUSAL} No document mentions `--deep-freeze`."
    assert answer.raw_text == answer.text  # the reply the UI renders (ui.render.reply_markdown)
    assert reply_markdown(answer) == answer.text  # the UI shows the term, as code
    assert answer.unanswerable_probability < DEFAULT_MODEL.threshold
    streamed = RAGPipeline(
        RAGConfig.of(), retriever=CoverageRetriever(0.7), generator=FakeGenerator("x [1].")
    ).stream("Are Python lists mutable with --deep-freeze?")
    assert next(streamed) == answer.text  # the stream shows the same refusal
    # terms the corpus holds, in any case, pass; the switch turns the rule off
    held, gen = _ask("Do lists have __ENTER__, or the `Mutable Sequences`?", dense=0.7)
    assert not held.refused and gen.calls
    off, gen = _ask("Are Python lists mutable with --deep-freeze?", dense=0.7, literal_terms=False)
    assert not off.refused and gen.calls
    # a product no document names: another product's question, refused and named
    other, gen = _ask("Are Python lists mutable in MongoDB?", dense=0.7)
    assert other.refused and not gen.calls
    assert other.text == f"{REFUSAL} No document mentions `MongoDB`."
    same, gen = _ask("Are lists mutable in Python?", dense=0.7)
    assert not same.refused and gen.calls


@pytest.mark.parametrize(
    ("question", "asked"),
    [
        (
            "Port 8000 is taken on my box. Can I run the server on another port?",
            "Can I run the server on another port?",
        ),
        (
            "My laptop died! Is my index broken? What should I do?",
            "Is my index broken? What should I do?",
        ),
        ("It says 'done?' but nothing shows. Why is the list empty?\"", 'Why is the list empty?"'),
        ("How do I list my indexes?", None),  # every sentence asks
        ("Is it safe? How do I lock it down?", None),
        ("Tell me about indexes. And chunking.", None),  # none asks
        # no sentence ends at an initial or an abbreviation
        ("Who did the U.S. collaborate with in 1975?", None),
        ("Kurt H. Debus was appointed what position?", None),
        ("Who mapped the St. Johns River?", None),
        ("I use tools, e.g. Git. How do I undo a commit?", "How do I undo a commit?"),
    ],
)
def test_asked_sentences_leave_out_a_preamble_only(question, asked):
    assert asked_sentences(question) == asked


PREAMBLE = "My quokka festival laptop zebra died at the flamingo gala."


def test_a_preamble_does_not_refuse_a_question_its_asking_sentence_answers():
    # the preamble's words are in no document: they take the whole question's coverage under
    # the threshold, the asking sentence alone passes
    question = f"{PREAMBLE} Are Python lists mutable?"
    assert check(CoverageRetriever(0.5), question, CoverageRetriever(0.5).search(""), 0.338).refuse
    answer, gen = _ask(question, dense=0.5)
    assert not answer.refused and len(gen.calls) == 1
    assert answer.unanswerable_probability < DEFAULT_MODEL.threshold  # the asking sentence's
    assert PREAMBLE in gen.calls[0][-1]["content"]  # the decoder reads the whole question
    retriever = CoverageRetriever(0.5)
    RAGPipeline(RAGConfig.of(), retriever=retriever, generator=FakeGenerator("x [1].")).answer(
        question
    )
    assert retriever.queries == [question, "Are Python lists mutable?"]  # searched again
    # asked alone, the same question needs no second search
    retriever = CoverageRetriever(0.5)
    RAGPipeline(RAGConfig.of(), retriever=retriever, generator=FakeGenerator("x [1].")).answer(
        "Are Python lists mutable?"
    )
    assert retriever.queries == ["Are Python lists mutable?"]


def test_a_preamble_question_is_refused_when_its_asking_sentence_fails_too():
    answer, gen = _ask(f"{PREAMBLE} Who ruled the Normans in 1066?", dense=0.15)
    assert answer.refused and not gen.calls
    # a literal term no document holds refuses the whole question, preamble or not
    answer, gen = _ask("I always pass --deep-freeze. Are Python lists mutable?", dense=0.7)
    assert answer.refused and not gen.calls and "`--deep-freeze`" in answer.text


def test_an_index_mentions_what_its_published_generation_holds(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs", {"a.md": "Run `tool --dry-run` first.\n"})
    ingest([docs], index="mentions", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever("mentions")
    assert r.mentions(["--DRY-RUN", "--wet-run"]) == [True, False]
    write_docs(docs, {"b.md": "The --wet-run flag writes.\n"})
    ingest([docs], index="mentions", encoder=str(tiny_mlm_dir), progress=False)
    assert r.mentions(["--wet-run"]) == [True]  # a new generation: its text, not the old one's


def test_refusal_text_names_every_missing_term():
    d = decide(DEFAULT_MODEL, 0.7, 0.9)
    assert refusal_text(d, REFUSAL) == REFUSAL and refusal_text(None, REFUSAL) == REFUSAL
    d.missing = ["--a", "b_c"]
    assert refusal_text(d, REFUSAL) == f"{REFUSAL} No document mentions `--a`, `b_c`."


def _rows(pairs):
    """Rows of (answerable, dense=coverage) for the fit and the rates."""
    return [{"answerable": a, "holds_answer": a, "dense": x, "coverage": x} for a, x in pairs]


def test_threshold_keeps_false_refusals_within_the_limit():
    rows = _rows([(True, 0.9)] * 18 + [(True, 0.2), (True, 0.3)] + [(False, 0.1)] * 10)
    probs = [1 - r["dense"] for r in rows]
    t = pick_threshold(rows, probs, 0.05)
    assert rates(rows, probs, t) == {"refusal_rate_unanswerable": 1.0, "false_refusal_rate": 0.05}
    model = fit(rows, 0.05, "synthetic")
    assert model.dense_weight < 0 and model.coverage_weight < 0
    got = rates(rows, [model.probability(r["dense"], r["coverage"]) for r in rows], model.threshold)
    assert got["false_refusal_rate"] <= 0.05 and got["refusal_rate_unanswerable"] == 1.0


def test_signals_label_removed_articles_and_their_coverage_is_lower(squad, tiny_mlm_dir):  # noqa: F811
    cfg = AnswerabilityEvalConfig.of(
        squad=str(squad), articles=["Paints", "Flags"], limit=0, removed_articles=1, k=3
    )
    rows = signals(cfg, encoder=str(tiny_mlm_dir), progress=False)
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    # k = 3 passages: every paragraph left in the index, so each answerable one holds its answer
    assert len(answerable) == len(unanswerable) == 3 and all(r["holds_answer"] for r in answerable)
    assert not any(r["holds_answer"] for r in unanswerable)
    # the removed article's name is in none of the indexed paragraphs
    assert max(r["coverage"] for r in unanswerable) < min(r["coverage"] for r in answerable)
    assert all(isinstance(r["dense"], float) for r in rows)


def test_cli_measures_a_fitted_model_and_names_a_bad_one(squad, tiny_mlm_dir, tmp_path, capsys):  # noqa: F811
    from evals.answerability import main

    base = ["--squad", str(squad), "--articles", "Paints", "Flags", "--limit", "0", "--k", "3"]
    base += ["--removed-articles", "1"]
    base += ["--encoder", str(tiny_mlm_dir)]
    out = tmp_path / "fit.json"
    assert main([*base, "--fit", "--out", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert AnswerabilityModel(**fitted["model"]).threshold <= 1.0
    assert fitted["metrics"]["false_refusal_rate"] <= 0.05
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([*base, "--model", str(bad)]) == 2  # bad input: exit 2, one line naming it
    assert "--model" in capsys.readouterr().err


def test_each_encoder_gets_the_model_fitted_on_its_cosines(monkeypatch):
    from types import SimpleNamespace

    from rag.answer import answerability as A

    other = A.AnswerabilityModel(1.0, 1.0, 0.0, 0.5, "test")
    monkeypatch.setitem(A.MODELS, "minilm-tuned", other)
    by_path = SimpleNamespace(name="/home/x/artifacts/models/minilm-tuned", path=None)
    by_folder = SimpleNamespace(name="custom label", path="/somewhere/minilm-tuned")
    assert A.model_for(by_path) is other and A.model_for(by_folder) is other
    assert A.model_for(SimpleNamespace(name="minilm", path=None)) is A.DEFAULT_MODEL
    assert A.model_for(SimpleNamespace(name="my-encoder", path=None)) is A.DEFAULT_MODEL
    assert A.model_for(None) is A.DEFAULT_MODEL


def test_tuned_model_folds_its_threshold_without_changing_a_decision():
    from rag.answer.answerability import MODELS, TUNED_MODEL, AnswerabilityModel

    fitted = AnswerabilityModel(-6.149, -6.115, 5.166, 0.354)  # evals.answerability's output
    grid = [(d / 50, c / 50) for d in range(-10, 51) for c in range(0, 51)]
    flips = [
        (d, c)
        for d, c in grid
        if (fitted.probability(d, c) >= 0.354) != (TUNED_MODEL.probability(d, c) >= 0.338)
    ]
    assert len(flips) <= 2  # only points within rounding of the boundary may differ
    assert MODELS["minilm-tuned"] is TUNED_MODEL and TUNED_MODEL.threshold == 0.338


def test_the_sentence_signal_lowers_the_probability_and_is_required_where_weighed():
    from rag.answer.answerability import SENTENCE_MODEL

    m = SENTENCE_MODEL
    assert m.reads_units and not DEFAULT_MODEL.reads_units
    # a passage that matches in general, without a sentence that answers, is refused
    assert m.probability(0.5, 0.6, 0.9) < m.threshold <= m.probability(0.5, 0.6, 0.3)
    with pytest.raises(ValueError, match="unit"):
        m.probability(0.5, 0.6)
    assert (
        decide(m, 0.5, 0.6, unit=0.3).unit == 0.3 and decide(DEFAULT_MODEL, 0.5, 0.6).unit is None
    )


def test_the_three_signal_model_decides_where_the_encoder_read_the_sentences(monkeypatch):
    from types import SimpleNamespace

    from rag.answer import answerability as A

    minilm, tuned = (SimpleNamespace(name=n, path=None) for n in ("minilm", "minilm-tuned"))
    assert A.model_for(minilm, units=True) is A.SENTENCE_MODEL
    assert A.model_for(minilm) is A.DEFAULT_MODEL
    # an encoder with a two-signal fit only keeps it; one with neither gets minilm's
    assert A.model_for(tuned, units=True) is A.TUNED_MODEL
    assert A.model_for(SimpleNamespace(name="x", path=None), units=True) is A.SENTENCE_MODEL
    r = CoverageRetriever(0.5)
    hits = r.search("lists")
    monkeypatch.setattr(r, "encoder", minilm, raising=False)
    with_unit, without = check(r, "lists", hits, 0.338, unit=0.2), check(r, "lists", hits, 0.338)
    assert with_unit.unit == 0.2 and without.unit is None
    assert with_unit.probability == pytest.approx(
        A.SENTENCE_MODEL.probability(without.dense, without.coverage, 0.2)
    )
    assert without.probability == pytest.approx(
        A.DEFAULT_MODEL.probability(without.dense, without.coverage)
    )


def test_fit_weighs_the_sentence_signal_when_the_rows_have_it():
    rows = _rows([(True, 0.5)] * 10 + [(False, 0.5)] * 10)
    for r in rows:  # retrieval alone cannot tell them apart; the best sentence can
        r["unit"] = 0.9 if r["answerable"] else 0.2
    model = fit(rows, 0.05, "synthetic")
    assert model.reads_units and model.unit_weight < 0
    probs = [model.probability(r["dense"], r["coverage"], r["unit"]) for r in rows]
    assert rates(rows, probs, model.threshold)["refusal_rate_unanswerable"] == 1.0


def test_best_unit_reads_only_the_passages_the_check_reads():
    import numpy as np

    from rag.answer.evidence import Scored, Unit, best_unit

    units = [Unit(p, 0, 1, True) for p in (0, 1, 5)]
    scored = Scored(units, ["a", "b", "c"], np.array([0.2, -np.inf, 0.9]), [False] * 3)
    assert best_unit(scored, 5) == 0.2 and best_unit(scored, 6) == 0.9
    assert best_unit(Scored([], [], np.zeros(0), []), 5) is None
    # a factoid's units are ranked with rarity-weighted words; the check weighs the plain share
    ranked = Scored(units, ["a", "b", "c"], np.array([0.9, 0.1, 0.1]), [False] * 3, scored.scores)
    assert best_unit(ranked, 5) == 0.2


def test_sentence_model_folds_its_threshold_without_changing_a_decision():
    from rag.answer.answerability import SENTENCE_MODEL, UNIT_MODELS, AnswerabilityModel

    # evals.answerability's output
    fitted = AnswerabilityModel(-3.624, -4.848, 6.613, 0.358, unit_weight=-5.129)
    grid = [(d / 10, c / 10, u / 10) for d in range(0, 11) for c in range(0, 11) for u in range(11)]
    flips = [
        g
        for g in grid
        if (fitted.probability(*g) >= 0.358) != (SENTENCE_MODEL.probability(*g) >= 0.338)
    ]
    assert len(flips) <= 2  # only points within rounding of the boundary may differ
    assert UNIT_MODELS["minilm"] is SENTENCE_MODEL and SENTENCE_MODEL.threshold == 0.338


def test_the_eval_measures_the_model_the_product_ships_for_its_encoder():
    from evals.answerability import load_model
    from rag.answer import answerability as A

    assert load_model(None) is A.SENTENCE_MODEL
    assert load_model(None, "minilm", units=False) is A.DEFAULT_MODEL
    assert load_model(None, "artifacts/models/minilm-tuned") is A.TUNED_MODEL  # no 3-signal fit
