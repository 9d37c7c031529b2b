"""``GET /v1/documents`` and ``DELETE /v1/documents/{path}`` of rag.serve, through FastAPI's test
client over a real index (ingested with the tiny encoder); the chat pipeline is scripted
(serve_support.ScriptedPipeline), the documents routes call rag.ingest.manage itself."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from ingest_support import DOCS, write_docs
from serve_support import KEY, ScriptedPipeline
from test_ingest import index_state

from rag.config import RAGConfig
from rag.ingest import ingest, list_documents
from rag.paths import indexes_dir
from rag.serve.app import ServeOptions, create_app

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def served(tmp_path, tiny_mlm_dir):
    """(client, index name, docs folder): the app serving a fresh index as its --index."""
    docs = write_docs(tmp_path / "docs", {**DOCS, "guide/setup.md": "# Setup\n\nInstall it.\n"})
    name = f"api-{tmp_path.name}"
    ingest([docs], index=name, encoder=str(tiny_mlm_dir), progress=False)
    (indexes_dir() / f"empty-{tmp_path.name}").mkdir(parents=True)  # never ingested: no model
    app = create_app(RAGConfig(index=name), ScriptedPipeline, options=ServeOptions(api_key=KEY))
    with TestClient(app) as client:
        yield client, name, docs


def test_documents_need_the_key(served):
    client, name, _ = served
    for method, path in (("GET", "/v1/documents"), ("DELETE", "/v1/documents/notes.txt")):
        r = client.request(method, path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = client.request(method, path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    assert len(list_documents(name).documents) == len(DOCS) + 1  # nothing was removed


def test_list_shows_relative_paths_only(served):
    client, name, docs = served
    r = client.get("/v1/documents", headers=AUTH)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == f"rag:{name}"
    assert body["generation"] == "gen-000001"
    rows = {d["path"]: d for d in body["data"]}
    assert sorted(rows) == sorted([*DOCS, "guide/setup.md"])
    assert set(rows["notes.txt"]) == {
        "path",
        "type",
        "chunks",
        "bytes",
        "hash",
        "ingested",
        "encoder",
    }
    assert rows["notes.txt"]["type"] == "txt" and rows["notes.txt"]["chunks"] >= 1
    assert str(docs) not in r.text  # the server's absolute paths never leave it
    same = client.get("/v1/documents", params={"model": f"rag:{name}"}, headers=AUTH)
    assert same.json()["data"] == body["data"]


def test_delete_removes_and_publishes(served):
    client, name, _ = served
    before = index_state(name)
    r = client.delete("/v1/documents/guide/setup.md", headers=AUTH)  # a path with a folder
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["path"] for d in body["deleted"]] == ["guide/setup.md"]
    assert body["generation"] == "gen-000002" and body["chunks_removed"] >= 1
    assert body["chunks"] == len(before["chunks"]) - body["chunks_removed"]
    listed = client.get("/v1/documents", headers=AUTH).json()
    assert "guide/setup.md" not in {d["path"] for d in listed["data"]}
    assert listed["generation"] == "gen-000002"
    assert client.delete("/v1/documents/notes.txt", headers=AUTH).json()["chunks"] == len(
        index_state(name)["chunks"]
    )


def test_unknown_path_or_index_is_404_and_changes_nothing(served, tmp_path):
    client, name, docs = served
    before = index_state(name)
    r = client.delete("/v1/documents/nope/missing.md", headers=AUTH)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "document_not_found" and "'nope/missing.md'" in err["message"]
    assert index_state(name) == before
    r = client.get("/v1/documents", params={"model": "rag:no-such"}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.get("/v1/documents", params={"model": f"rag:empty-{tmp_path.name}"}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert str(indexes_dir()) not in r.text
    r = client.delete("/v1/documents/..%2F..%2Fetc", headers=AUTH)
    assert r.status_code == 404 and index_state(name) == before
    absolute = f"/v1/documents/{docs / 'notes.txt'}"  # the manifest's key: not taken here
    assert str(docs).startswith("/") and "//" in absolute
    r = client.delete(absolute, headers=AUTH)
    assert r.status_code == 404 and index_state(name) == before
