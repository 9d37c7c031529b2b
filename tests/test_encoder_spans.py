"""Late chunking (rag.retrieval.encoder.Encoder.encode_spans): a span's vector is pooled from its
tokens read inside the whole text, in input order, None past the encoder's length; only for
mean-pooling encoders on torch."""

from __future__ import annotations

import numpy as np
import pytest

from rag.retrieval.encoder import Encoder

SENTENCE = "The bridge was finished in 1890."


@pytest.fixture(scope="module")
def encoder(tiny_mlm_dir):
    return Encoder.load(tiny_mlm_dir, device="cpu", precision="fp32")


def test_a_span_carries_its_context_and_comes_back_in_input_order(encoder):
    assert encoder.reads_in_context
    a = f"Rivers flood in spring. {SENTENCE}"
    b = f"{SENTENCE} Zebras have stripes and eat grass all day long in the dry season."
    spans_a = [(0, 23), (24, len(a))]
    spans_b = [(0, len(SENTENCE))]
    got = encoder.encode_spans([a, b], [spans_a, spans_b])
    assert [len(g) for g in got] == [2, 1]
    for v in (*got[0], *got[1]):
        assert v.dtype == np.float32 and abs(float(np.linalg.norm(v)) - 1) < 1e-5
    # the same span, each text alone: batching (longest first) does not mix them up
    assert np.allclose(encoder.encode_spans([a], [spans_a])[0][1], got[0][1], atol=1e-5)
    assert np.allclose(encoder.encode_spans([b], [spans_b])[0][0], got[1][0], atol=1e-5)
    # the same sentence read in two passages: two vectors (attention sees its neighbours)
    assert float(got[0][1] @ got[1][0]) < 0.9999


def test_a_text_without_spans_is_not_read(encoder, monkeypatch):
    read: list[str] = []
    encode = encoder.model.encode_document

    def spy(texts, **kw):
        read.extend(texts)
        return encode(texts, **kw)

    monkeypatch.setattr(encoder.model, "encode_document", spy)
    got = encoder.encode_spans(["Zebras have stripes.", SENTENCE], [[], [(0, 10)]])
    assert read == [SENTENCE] and got[0] == [] and got[1][0] is not None
    assert encoder.encode_spans([SENTENCE], [[]]) == [[]] and read == [SENTENCE]


def test_a_span_the_encoder_never_read_is_none(encoder):
    encoder.model.max_seq_length, keep = 12, encoder.model.max_seq_length
    try:
        text = " ".join(["word"] * 40) + " " + SENTENCE
        (vecs,) = encoder.encode_spans([text], [[(0, 4), (len(text) - len(SENTENCE), len(text))]])
    finally:
        encoder.model.max_seq_length = keep
    assert vecs[0] is not None and vecs[1] is None


def test_a_cut_text_reads_as_the_part_the_encoder_saw(encoder):
    from rag.documents.chunking import token_offsets

    text = " ".join(["river bank"] * 30)
    encoder.model.max_seq_length, keep = 12, encoder.model.max_seq_length
    try:
        (off,) = token_offsets(encoder.tokenizer, [text])
        seen = text[: off[12 - 2][1]]  # [CLS], ten tokens, [SEP]: the end of the tenth
        (cut,) = encoder.encode_spans([text], [[(0, 5)]])
        (alone,) = encoder.encode_spans([seen], [[(0, 5)]])
    finally:
        encoder.model.max_seq_length = keep
    assert np.allclose(cut[0], alone[0], atol=1e-5)  # token states line up with their offsets


def test_only_a_mean_pooling_encoder_reads_spans_in_context(tiny_mlm_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tr = Transformer(str(tiny_mlm_dir), max_seq_length=32)
    cls = SentenceTransformer(
        modules=[tr, Pooling(tr.get_embedding_dimension(), "cls")], device="cpu"
    )
    enc = Encoder(cls, precision="fp32")
    assert not enc.reads_in_context
    with pytest.raises(ValueError, match="cannot pool spans"):
        enc.encode_spans([SENTENCE], [[(0, 3)]])
