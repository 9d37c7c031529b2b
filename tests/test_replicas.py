"""Issue 14 part 2, acceptance 2: two ``rag.serve`` processes on one Chroma server answer during
a re-ingest with zero errors, switch to the new generation without a restart, and never answer
from a mix of generations (bounded loopback load test).

One real ``chroma run`` server (conftest's ``chroma_server``), an index ingested into it, two
``python -m rag.serve`` replicas (tiny encoder, tiny random decoder, 6 new tokens), four client
threads (two per replica, every other request streamed) asking for the whole run, and a third
process (``python -m rag.ingest``) that adds, changes and deletes a file meanwhile. The load
driver is the benchmark's own (benchmarks/replicas.py)."""

from __future__ import annotations

import time

import httpx
import pytest
from generate_support import build_model, build_tokenizer
from ingest_support import write_docs

from benchmarks.replicas import (
    PROBE_NAME,
    PROBE_QUESTION,
    Load,
    ask,
    change_folder,
    run_ingest,
    start_replica,
    stop_replicas,
    summary,
    wait_ready,
)
from rag.ingest import ingest
from rag.storage.manifest import CURRENT, index_dir, read_chunks

# a Chroma server and three Python processes on loopback: ~45 s on a 2-core AVX2 CPU
pytestmark = [pytest.mark.server, pytest.mark.slow]

INDEX = "replicas"
QUESTIONS = [
    "How do I read a file line by line?",
    "How are exceptions handled with try and except?",
    "Where do zebras and giraffes live?",
]
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # four processes on a shared machine


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A saved 2-layer random Llama with a ChatML tokenizer: answers are noise, but every
    step of a real answer (prompt, decoding, citation completion, verification) runs."""
    path = tmp_path_factory.mktemp("replica-decoder")
    tokenizer = build_tokenizer()
    build_model("llama", tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_two_replicas_answer_through_a_reingest(
    tmp_path, chroma_server, tiny_mlm_dir, tiny_decoder
):
    docs = write_docs(tmp_path / "docs")
    first = ingest(
        [docs], index=INDEX, encoder=str(tiny_mlm_dir), backend="chroma",
        chroma_url=chroma_server, progress=False,
    )  # fmt: skip
    serve_args = [
        "--decoder", str(tiny_decoder), "--adapter", "none", "--device", "cpu",
        "--decoder-precision", "fp32", "--max-new-tokens", "6", "--k", "2", "--log-level", "warning",
    ]  # fmt: skip
    replicas = [start_replica(INDEX, serve_args, tmp_path, i, ENV) for i in range(2)]
    try:
        wait_ready(replicas, timeout=180)
        load = Load(replicas, QUESTIONS, clients=2).start()
        time.sleep(2)  # both replicas answer from the first generation
        edit = change_folder(docs)
        report = run_ingest(docs, INDEX, env=ENV)
        time.sleep(2)  # and go on answering after the publication
        records = load.stop()
        probes = [
            ask(httpx.Client(timeout=60), r.url, PROBE_QUESTION, i, extra={"mode": "bm25", "k": 1})
            for i, r in enumerate(replicas)
        ]
        health = [httpx.get(r.url + "/health", timeout=10).json() for r in replicas]
    finally:
        stop_replicas(replicas)
    logs = "\n".join(r.tail(1500) for r in replicas)

    old, new = first.generation, report["generation"]
    assert new != old and report["added"] and report["updated"] and report["removed"]
    root = index_dir(INDEX)
    chunks = {g.name: set(read_chunks(g)) for g in root.glob("gen-*")}  # both are kept
    assert set(chunks) == {old, new}

    # zero errors: every request got HTTP 200 and a well-formed answer
    bad = [r for r in records if r.error or r.status != 200]
    assert not bad, f"{len(bad)} of {len(records)} failed, e.g. {bad[:3]}\n{logs}"
    # no answer mixes generations: its passages all come from the one it names
    for r in records:
        if r.chunk_ids:
            assert r.generation in chunks, r
            assert set(r.chunk_ids) <= chunks[r.generation], r
    # both replicas answered before and after; after the re-ingest only from the new one
    published = (root / CURRENT).stat().st_mtime
    stats = summary(records, published, old, new)
    for i, s in enumerate(stats):
        assert s["answers_old"] > 0 and s["answers_new"] > 0, (s, logs)
        after = [r for r in records if r.replica == i and r.sent > report["finished"]]
        assert after, s
        assert all(r.generation in (new, "") for r in after), s
        assert all(edit["deleted"] not in p for r in after for p in r.paths), s
    # the added file is found by both without a restart; /health names the loaded generation
    for p in probes:
        assert not p.error and p.generation == new and p.paths == [PROBE_NAME], p
    assert [h["generations"] for h in health] == [{INDEX: new}] * 2
