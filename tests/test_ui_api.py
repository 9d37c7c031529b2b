"""The UI's API through gradio_client on loopback: a cited chat answer, and uploads — a
traversal-style name, an oversized file and a binary file are each refused with a readable
message and leave the index byte-for-byte unchanged; a good file is ingested and retrievable."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from ui_support import ScriptedGenerator, build_index, module_rag_home, scripted_factory, serve

from rag.storage.paths import indexes_dir, rag_home

pytestmark = pytest.mark.server

INDEX = "apitest"
LIMIT_MB = 0.002  # ~2 KiB per file for this app; Gradio's own hard limit is twice that


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from gradio_client import Client

    with module_rag_home(tmp_path_factory):
        build_index(tmp_path_factory.mktemp("corpus"), INDEX, "minilm")
        with serve(INDEX, scripted_factory(ScriptedGenerator(delay=0)), max_upload_mb=LIMIT_MB) as (
            url,
            _,
        ):
            yield Client(url, verbose=False)


def index_digest() -> dict[str, str]:
    root = indexes_dir() / INDEX
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def ask(client, question: str, history=None):
    return client.predict(
        question, history or [], INDEX, "(index default)", "smollm2", "(none)", "hybrid", 3, 0.0, 32,
        api_name="/chat",
    )  # fmt: skip


def upload(client, files):
    return client.predict(files, INDEX, api_name="/upload")


def test_chat_answer_cites_retrieved_passage(client):
    chat, box, sources, uncited = ask(client, "How do I close a file?")
    reply = chat[-1]["content"][0]["text"]
    assert box == ""
    assert 'id="src-1"' in sources and "files.md" in sources
    assert "Closing a file" in sources or "Opening a file" in sources
    # The scripted reply, "According to the documents, see passage [1].", claims nothing the
    # passage says: the pipeline's citation check flags it, and both panels show it.
    assert '<a href="#src-1" class="rag-cite rag-unsupported"' in reply and "[1?]" in reply
    assert "not supported by the passage they name" in reply
    assert ">unsupported</span>" in sources


def test_bad_setting_is_a_readable_error(client):
    chat, _, sources, _ = client.predict(
        "hi there friends", [], "../etc", "(index default)", "smollm2", "(none)", "hybrid", 3, 0.0, 32,
        api_name="/chat",
    )  # fmt: skip
    text = chat[-1]["content"][0]["text"]
    assert text.startswith("**Error:**") and "not allowed" in text and "Traceback" not in text


def _raw_upload(client, name: str, data: bytes) -> str:
    """Upload bytes under an arbitrary multipart file name (as a hostile client could)."""
    r = httpx.post(client.upload_url, files=[("files", (name, data))])
    r.raise_for_status()
    return r.json()[0]


def _raw_call(client, api_name: str, data: list) -> list:
    """Call an endpoint through Gradio's REST API with a hand-made payload (gradio_client would
    re-upload any local file dict under its own, clean name)."""
    base = client.src.rstrip("/") + "/gradio_api/call/" + api_name
    event = httpx.post(base, json={"data": data}).raise_for_status().json()["event_id"]
    body = httpx.get(f"{base}/{event}", timeout=120).raise_for_status().text
    lines = body.strip().splitlines()
    assert lines[-2] == "event: complete", body
    return json.loads(lines[-1].removeprefix("data: "))


def test_traversal_name_refused_and_index_unchanged(client):
    before = index_digest()
    path = _raw_upload(client, "../../evil.md", b"# Evil\n\nShould never be ingested.\n")
    assert "/../" not in path  # Gradio keeps only the last part of the multipart name...
    files = [{"path": path, "orig_name": "../../evil.md", "meta": {"_type": "gradio.FileData"}}]
    (report,) = _raw_call(client, "upload", [files, INDEX])  # ...we refuse the claimed name
    assert "refused **../../evil.md**" in report and "path" in report
    assert "0 file(s) accepted" in report
    assert index_digest() == before
    assert not (rag_home() / "uploads" / "evil.md").exists()


def test_oversized_upload_refused_and_index_unchanged(client, tmp_path):
    from gradio_client import handle_file

    before = index_digest()
    big = tmp_path / "big.md"
    big.write_text("# Big\n\n" + "word " * 600)  # ~3 KB: over our 2 KiB, under Gradio's 4 KiB
    report = upload(client, [handle_file(big)])
    assert "refused **big.md**" in report and "too large" in report
    huge = b"x" * 10_000  # over Gradio's hard limit: refused at the transport
    r = httpx.post(client.upload_url, files=[("files", ("huge.md", huge))])
    assert r.status_code == 413 and "maximum allowed size" in r.text
    assert index_digest() == before


def test_binary_and_unsupported_uploads_refused(client, tmp_path):
    from gradio_client import handle_file

    before = index_digest()
    blob = tmp_path / "blob.md"
    blob.write_bytes(b"\x00\x01\x02binary\xff" * 20)
    exe = tmp_path / "tool.exe"
    exe.write_bytes(b"MZ\x90\x00")
    report = upload(client, [handle_file(blob), handle_file(exe)])
    assert "refused **blob.md**: binary" in report
    assert "refused **tool.exe**: unsupported file type" in report
    assert index_digest() == before


def test_good_upload_is_ingested_and_retrievable(client, tmp_path):
    from gradio_client import handle_file

    note = tmp_path / "kettle.md"
    note.write_text(
        "# Kettle\n\n## Descaling\n\nDescale the kettle with citric acid every month.\n"
    )
    before = index_digest()
    report = upload(client, [handle_file(note)])
    assert "1 file(s) accepted, 0 refused" in report and "- refused" not in report
    assert index_digest() != before
    _, _, sources, _ = ask(client, "How often should I descale the kettle with citric acid?")
    assert "kettle.md" in sources


def test_load_benchmark_runs_against_the_app(client, tmp_path):
    from benchmarks.ui_load import LoadConfig, run

    cfg = LoadConfig(url=client.src, index=INDEX, sessions=2, duration=2.0, k=2, out=str(tmp_path))
    summary = run(cfg)
    assert summary["errors"] == 0 and summary["requests"] >= 2, summary
    assert summary["p50_latency_s"] <= summary["p95_latency_s"]
    assert 0 < summary["p50_ttft_s"] <= summary["p95_latency_s"]
    assert (tmp_path / "results.json").exists() and (tmp_path / "latency.png").exists()
