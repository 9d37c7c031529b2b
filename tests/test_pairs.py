"""Pair mining: both sides from one passage, dev splits never used, files round-trip."""

from __future__ import annotations

import random

import pytest
from training_support import write_tiny_squad

from rag.documents import Document, Heading
from training.data import pairs as P

TEXT = (
    "Files\n=====\n\n"
    "Python opens files with the open function. The with statement closes them. "
    "Reading a file line by line uses a for loop over the file object. Binary mode returns bytes.\n\n"
    "Sockets\n=======\n\n"
    "A socket is an endpoint for sending data. The server binds an address and listens. "
    "A client connects to the server address. Data moves as bytes over the connection.\n"
)


def doc() -> Document:
    return Document(
        path="mem.rst",
        text=TEXT,
        headings=[Heading(0, 1, "Files"), Heading(TEXT.index("Sockets"), 1, "Sockets")],
    )


def test_passages_split_at_headings_and_keep_heading_path():
    ps = P.split_passages(doc(), max_words=200, min_words=5)
    assert [p.headings for p in ps] == [("Files",), ("Sockets",)]
    assert "socket" not in ps[0].text.lower() and "open function" in ps[0].text
    assert "=====" not in ps[0].text


def test_unsupervised_pairs_come_from_one_passage():
    ps = {p.id: p for p in P.split_passages(doc(), max_words=200, min_words=5)}
    rng = random.Random(0)
    crops = P.crop_pairs(list(ps.values()), rng)
    icts = P.ict_pairs(list(ps.values()), rng)
    heads = P.heading_pairs(list(ps.values()), min_title_words=1)
    assert crops and icts and heads
    for pair in crops + heads:
        src = ps[pair.source].text
        assert pair.anchor in src or pair.kind == "heading"
        assert pair.positive in src
    for pair in icts:
        src = ps[pair.source].text
        assert pair.anchor in src and pair.anchor not in pair.positive
        assert set(pair.positive.split()) <= set(src.split())
    assert {h.anchor for h in heads} == {"Files", "Sockets"}
    assert all(not h.positive.startswith(h.anchor) for h in heads)


def test_unsupervised_pairs_balanced_cap():
    pairs = P.unsupervised_pairs([doc()] * 3, seed=1, max_pairs=4)
    assert len(pairs) == 4
    assert len({p.kind for p in pairs}) >= 2


def test_squad_pairs_never_use_dev_articles(tmp_path):
    squad = write_tiny_squad(tmp_path / "squad.json")
    pairs = P.squad_pairs(squad)
    assert pairs and all(not p.source.startswith("squad:Normans/") for p in pairs)
    dev = P.squad_dev_texts(squad)
    assert dev and not any(p.anchor in dev or p.positive in dev for p in pairs)


def test_assert_no_dev_catches_a_leak():
    leak = P.Pair("a dev question?", "some passage", "squad", "squad:Normans/0")
    with pytest.raises(AssertionError):
        P.assert_no_dev([leak], dev_texts={"a dev question?"})
    with pytest.raises(AssertionError):
        P.assert_no_dev([leak], dev_sources={"squad:Normans/"})


def test_bm25_negatives_are_from_other_sources(tmp_path):
    squad = write_tiny_squad(tmp_path / "squad.json")
    pairs = P.add_bm25_negatives(P.squad_pairs(squad))
    pos_sources = {p.positive: p.source for p in pairs}
    assert all(p.negative and pos_sources[p.negative] != p.source for p in pairs)


def test_pairs_file_round_trip(tmp_path):
    pairs = [P.Pair("q", "d", "file", "x:1", "neg"), P.Pair("q2", "d2", "crop", "y#0")]
    P.write_pairs(pairs, tmp_path / "p.jsonl")
    assert P.read_pairs(tmp_path / "p.jsonl") == pairs


def test_real_scifact_and_squad_pairs_exclude_dev(shared_data):
    from rag.evaluation.datasets import load_beir, scifact_split

    sci = P.scifact_pairs(shared_data / "scifact")
    ds = load_beir(shared_data / "scifact", "train")
    dev_claims = {ds.queries[q] for q in scifact_split(ds)[1]}
    assert sci and not any(p.anchor in dev_claims for p in sci)
    squad = P.squad_pairs(shared_data / "squad" / "squad-v1.1-dev-part.json")
    assert squad and not any(p.source.split(":")[1].split("/")[0] == "Super_Bowl_50" for p in squad)
