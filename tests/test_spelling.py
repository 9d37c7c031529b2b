"""Typo correction of questions against the index's words (rag.retrieval.spelling)."""

from __future__ import annotations

import json

import pytest
from ingest_support import write_docs
from test_answerability import CoverageRetriever
from test_pipeline import FakeGenerator

from rag.config import RAGConfig
from rag.ingest import ingest
from rag.models.registry import DEFAULT_DECODER
from rag.pipeline import RAGPipeline
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.retriever import CorpusRetriever, Retriever
from rag.retrieval.settings import RetrievalSettings
from rag.retrieval.spelling import (
    Speller,
    decoder_words,
    edits,
    searched,
    tokenizer_words,
    vocabulary_words,
)
from rag.search import main as search_main
from rag.storage.paths import models_dir

TEXTS = [
    "Use open() to open a file; the file object reads it line by line.",
    "open() returns a file object to read. Close the file when you are done.",
    "One alias names another command; an alias is set in the config.",
    "An alias may call all of the commands, all at once, for all users.",
    "Every list holds all items; all of them, all the time.",
]


def speller(known=("open", "file", "alias", "read", "line", "lines")) -> Speller:
    bm = BM25Index([str(i) for i in range(len(TEXTS))], TEXTS)
    return Speller(bm.doc_freq, frozenset(known), {"the", "one", "all", "and"})


def test_edits_try_neighbouring_swaps_before_other_single_edits():
    swaps, others = edits("opne")
    assert swaps == ["pone", "onpe", "open"]
    assert "one" in others and "opine" in others and "open" not in others


def test_a_word_no_chunk_holds_becomes_the_index_word_one_edit_away():
    fixed = speller().correct("how do i opne a fiel, line by line?")
    assert fixed.text == "how do i open a file, line by line?"  # spacing and punctuation kept
    assert fixed.fixes == [("opne", "open"), ("fiel", "file")]
    # a swap wins over a dropped letter ("one": also a stop word, never a correction)
    assert speller().correct("opne").text == "open"


def test_a_known_word_wins_over_a_swap_that_stems_alike():
    bm = BM25Index(["a", "b"], ["The server runs.", "A server stops."])
    assert Speller(bm.doc_freq, {"server"}).correct("the serveer").text == "the server"
    # unknown to the tokenizers, the swap comes first: it stems to "server" too
    assert Speller(bm.doc_freq, frozenset()).correct("the serveer").text == "the servere"


def test_a_word_the_tokenizer_knows_wins_over_a_commoner_stem():
    # "alls" stems to "all", in more chunks than "alias"; the tokenizer knows "alias" only
    assert speller().correct("set an alas").text == "set an alias"
    # known to no tokenizer, a replaced letter is no correction: "alls" is a non-word
    assert speller(known=()).correct("set an alas").text == "set an alas"


def test_a_non_word_one_letter_replaced_away_is_no_correction():
    bm = BM25Index(["a", "b"], ["Open a shell.", "The shell runs."])
    # "shelle" stems to "shell", but no tokenizer knows it, and it is no swap of "shelve"
    assert Speller(bm.doc_freq, frozenset()).correct("hg shelve").text == "hg shelve"
    assert Speller(bm.doc_freq, frozenset()).correct("a sehll").text == "a shell"  # a swap


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("how do I open a file", None),  # nothing misspelt
        ("open a fiel in Pyhton", "open a file in Pyhton"),  # a capitalised name is never
        ("run opne2 or opne_file or --opne or -opne", None),  # digits, identifiers, options
        ("the 'opne fiel' button, \"opne\" or `opne`", None),  # quoted: a label, a message
        ("edit src/opne.py, opne.path or key=opne", None),  # paths, dotted names, key=value
        ("a raed-only fiel's lines", "a read-only file's lines"),  # hyphens, apostrophes
        ("cloud storage", None),  # a word the tokenizer knows, though no chunk holds it
        ("ope fle", None),  # shorter than four letters
        ("zzzzzz", None),  # no index word one edit away
        ("öpne", None),  # not ASCII
    ],
)
def test_what_is_corrected_and_what_never_is(query, expected):
    fixed = speller(known=("cloud", "storage")).correct(query)
    assert fixed.text == (expected or query)
    assert bool(fixed.fixes) == (expected is not None)


def test_a_rare_stem_of_its_own_is_corrected_only_to_a_far_commoner_word():
    # "opne" stems to "opn", which one chunk holds: "open" (two chunks) is not 50 times as common
    bm = BM25Index(["a", "b", "c"], TEXTS[:2] + ["The opn tool is rare."])
    rare = Speller(bm.doc_freq, frozenset(), ())
    assert rare.correct("opne").text == "opne"
    texts = TEXTS[:1] * 60 + ["The opn tool is rare."]
    bm = BM25Index([str(i) for i in range(len(texts))], texts)
    assert Speller(bm.doc_freq, frozenset(), ()).correct("opne").text == "open"


def test_tokenizer_words_are_its_whole_words_lower_cased():
    class Tok:
        def get_vocab(self):
            return {"##ing": 0, "open": 1, "[CLS]": 3, "Read": 4, "x2": 5}

    assert tokenizer_words(Tok()) == {"open", "read"}
    assert tokenizer_words(object()) == frozenset()
    # byte-level BPE: only the tokens that begin a word ("ilst" is a piece of one)
    assert vocabulary_words(["Ġsystemd", "ilst", "ĠFile", "Ġ2x"]) == {"systemd", "file"}


def test_the_decoders_words_are_known_once_its_engine_folder_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path))  # its own: the folder must not outlive it
    folder = models_dir() / f"{DEFAULT_DECODER}-gguf"
    assert decoder_words() == frozenset()  # not built: nothing known from it
    folder.mkdir(parents=True)
    vocab = {"Ġsystemd": 0, "Ġnginx": 1, "ing": 2}
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    assert decoder_words() == {"systemd", "nginx"}


def test_searched_corrects_only_when_asked_and_the_retriever_can():
    class Fixing:
        def correct_typos(self, query):
            return speller().correct(query)

    assert searched(Fixing(), "opne a fiel", True) == "open a file"
    assert searched(Fixing(), "opne a fiel", False) == "opne a fiel"
    assert searched(object(), "opne a fiel", True) == "opne a fiel"  # a fake that cannot


def test_a_retriever_learns_the_decoders_words_once_its_folder_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path))  # its own: the folder must not outlive it
    texts = ["The trial runs.", "A trial ends."]
    corpus = CorpusRetriever(["a", "b"], texts, None, RetrievalSettings(mode="bm25"))
    assert corpus.correct_typos("a trail").text == "a trial"  # a swap; no decoder built yet
    folder = models_dir() / f"{DEFAULT_DECODER}-gguf"
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"Ġtrail": 0}}}))
    assert corpus.correct_typos("a trail").text == "a trail"  # a word, not a typo, now


class TypoRetriever(CoverageRetriever):
    """The answerability tests' retriever, correcting typos against its corpus."""

    def correct_typos(self, query):
        return self.engine.correct_typos(query)


def test_the_pipeline_searches_checks_and_answers_the_corrected_question():
    question = "Are Pyhton lsits mutable seqeunces?"
    gen = FakeGenerator("Lists are mutable [1].")
    pipe = RAGPipeline(RAGConfig.of(), retriever=TypoRetriever(0.7), generator=gen)
    answer = pipe.answer(question)
    assert answer.query == "Are Pyhton lists mutable sequences?"  # the name stays as typed
    assert not answer.refused and "lists mutable" in gen.calls[0][-1]["content"]
    off = RAGConfig.of(correct_typos=False)
    gen = FakeGenerator("Lists are mutable [1].")
    typed = RAGPipeline(off, retriever=TypoRetriever(0.7), generator=gen).answer(question)
    # as typed, the two words no passage holds carry the most weight: refused
    assert typed.query == question and typed.refused and not gen.calls


def test_an_index_corrects_against_its_published_generation(tmp_path, tiny_mlm_dir, capsys):
    zebras = {"a.md": "A zebra has stripes.\n", "b.md": "The zebra runs.\n"}
    docs = write_docs(tmp_path / "docs", zebras)
    ingest([docs], index="typos", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever("typos")
    assert r.correct_typos("where does the zebar run").text == "where does the zebra run"
    assert r.correct_typos("the atnelope runs").text == "the atnelope runs"
    write_docs(docs, {"c.md": "A gnu is an antelope.\n", "d.md": "The antelope grazes.\n"})
    ingest([docs], index="typos", encoder=str(tiny_mlm_dir), progress=False)
    assert (
        r.correct_typos("the atnelope runs").text == "the antelope runs"
    )  # the new generation's words
    # rag.search searches the corrected query, says so, and can search as typed
    assert search_main(["where does the zebar run", "--index", "typos", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["query"] == "where does the zebra run"
    assert out["typed"] == "where does the zebar run"
    args = ["zebar", "--index", "typos", "--json", "--no-correct-typos"]
    assert search_main(args) == 0
    assert json.loads(capsys.readouterr().out)["query"] == "zebar"
