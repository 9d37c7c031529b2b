"""Document filters pushed into the search (rag.retrieval.filters): ``--where path=GLOB`` and
``--where type=T``, ANDed, on an ingested index (FAISS and embedded Chroma). A filtered search
equals brute force over the filtered chunks in every mode (dense: exact inner products of the
stored vectors; BM25: the whole corpus's scores restricted to them; hybrid: the same fusion of
those two lists), k hits come back where the filtered set holds k, and the settings travel
through rag.toml, rag.search, rag.ask and the HTTP API's ``rag.filter``."""

from __future__ import annotations

import json
import re

import pytest
from ingest_support import DOCS, listed_index, write_docs

from rag.config import ConfigError, RAGConfig, load_config
from rag.ingest import ingest
from rag.retrieval.filters import FilterError, Where
from rag.retrieval.fusion import fuse
from rag.retrieval.retriever import Retriever
from rag.retrieval.settings import RetrievalSettings
from rag.search import main as search_main

LIBRARY = {
    f"library/{name}.md": f"# {name}\n\nThe {name} module {text}.\n"
    for name, text in (
        ("io", "reads and writes files line by line"),
        ("os", "walks directories and files"),
        ("csv", "reads comma separated files"),
        ("json", "parses and writes JSON files"),
        ("zipfile", "reads and writes zip files"),
    )
}
LIBRARY["library/howto.rst"] = "Howto\n=====\n\nRead a file line by line with a for loop.\n"
NO_RERANK = RetrievalSettings(rerank="none")


# ---------------------------------------------------------------------- parsing and matching


def test_parse_and_match():
    w = Where.parse(["path=library/*", "type=md,rst"])
    assert w.to_list() == ["path=library/*", "type=md,rst"]
    assert w.matches("library/io.md", "md") and w.matches("library/sub/x.rst", "rst")
    assert not w.matches("library/io.txt", "txt") and not w.matches("notes.md", "md")
    folder = Where.parse("path=library")  # no glob character: a document or a folder
    assert folder.matches("library/io.md", "md") and not folder.matches("library2/x.md", "md")
    assert Where.parse("path=notes.txt").matches("notes.txt", "txt")
    assert Where.parse({"type": ["markdown", ".PDF"]}).to_list() == ["type=md,pdf"]
    assert Where.parse({"path": "a/*"}) == Where.parse(["path=a/*"])
    assert not Where.parse(None) and not Where.parse([]) and Where.parse(w) is w
    for bad, named in (
        (["colour=red"], "'colour'"),
        (["type=pdff"], "'pdff'"),
        (["path"], "'path'"),
        (["path="], "path= needs a value"),
        ({"type": 3}, "'type'"),
    ):
        with pytest.raises(FilterError, match=named):
            Where.parse(bad)


def test_settings_and_config_carry_the_filter(tmp_path, monkeypatch):
    assert RetrievalSettings(where=["type=md", "path=a/*"]).where == ("type=md", "path=a/*")
    assert RAGConfig.of(where=["type=md"]).retrieval.where == ("type=md",)
    with pytest.raises(ConfigError, match="'colour'"):
        RAGConfig.of(where=["colour=red"])
    (tmp_path / "rag.toml").write_text('where = ["path=library/*", "type=md"]\n')
    assert load_config(tmp_path / "rag.toml").retrieval.where == ("path=library/*", "type=md")
    (tmp_path / "one.toml").write_text('where = "type=pdf"\n')
    assert load_config(tmp_path / "one.toml").retrieval.where == ("type=pdf",)
    (tmp_path / "bad.toml").write_text("where = [1]\n")
    with pytest.raises(ConfigError, match="where must be a list of str"):
        load_config(tmp_path / "bad.toml")

    from rag.ask import build_parser
    from rag.config import config_from_args

    monkeypatch.chdir(tmp_path)  # ./rag.toml is read under the flags
    args = build_parser().parse_args(["q", "--where", "type=rst", "--where", "path=x/*"])
    assert config_from_args(args).retrieval.where == ("type=rst", "path=x/*")
    assert config_from_args(build_parser().parse_args(["q"])).retrieval.where == (
        "path=library/*",
        "type=md",
    )


# ---------------------------------------------------------------------- on an ingested index


@pytest.fixture(params=["faiss", "chroma"])
def index(request, tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs", {**DOCS, **LIBRARY})
    name = f"filter-{request.param}-{tmp_path.name}"
    ingest([docs], index=name, encoder=str(tiny_mlm_dir), backend=request.param, progress=False)
    return name


def brute_force(r: Retriever, query: str, allowed: set[str], mode: str, n: int):
    """What a search restricted to ``allowed`` must find: exact inner products of the stored
    vectors, the whole corpus's BM25 scores, and (hybrid) the engine's fusion of those two."""
    ids = sorted(allowed)
    q = r.encoder.encode([query], kind="query")[0]
    exact = r.engine.vectors.vectors(ids) @ q
    dense = sorted(zip(ids, map(float, exact)), key=lambda p: -p[1])[:n]
    scores = dict(r.engine.bm25.search(query, k=len(r.chunks)))
    sparse = sorted(((i, scores[i]) for i in ids if i in scores), key=lambda p: -p[1])[:n]
    if mode == "dense":
        return dense
    if mode == "bm25":
        return sparse
    s = r.settings
    return fuse(dense, sparse, s.fusion, s.alpha, s.norm)


def ranked(pairs) -> list[tuple[float, str]]:
    """(id, score) pairs in rank order, equal scores (BM25 gives two same-length pages that
    share the query's terms the very same score) in id order: the order up to ties."""
    return sorted((-round(float(s), 4), i) for i, s in pairs)


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_filtered_search_equals_brute_force_over_the_subset(index, mode):
    r = Retriever.from_settings(index, NO_RERANK)
    where = ["path=library/*", "type=md"]
    allowed = {
        i for i, c in r.chunks.items() if "/library/" in c.source and c.source.endswith(".md")
    }
    assert 5 <= len(allowed) < len(r.chunks)
    for query in ("read a file line by line", "zebra stripes savanna"):
        hits = r.search(query, k=4, mode=mode, where=where)
        want = brute_force(r, query, allowed, mode, n=max(4, r.settings.depth))[:4]
        got = [(h.chunk.id, h.score) for h in hits]
        assert ranked(got) == ranked(want), (mode, query)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)
        assert all(h.chunk.path.startswith("library/") for h in hits)


def test_k_hits_come_from_the_filtered_set(index):
    """No post-filter: the unfiltered top k holds fewer than k library pages, the filtered
    search returns k of them (and the filter in the settings applies to every search that names
    none; ``where=[]`` lifts it)."""
    r = Retriever.from_settings(index, NO_RERANK)
    query = next(c.text for c in r.chunks.values() if c.source.endswith("notes.txt"))
    top = r.search(query, k=3, mode="dense")  # led by the notes chunk itself (cosine 1)
    assert len([h for h in top if h.chunk.path.startswith("library/")]) < 3
    hits = r.search(query, k=3, mode="dense", where="path=library/*")
    assert len(hits) == 3 and all(h.chunk.path.startswith("library/") for h in hits)
    only_rst = r.search("line by line", k=5, mode="hybrid", where=Where.parse("type=rst"))
    assert {h.chunk.path for h in only_rst} == {"errors.rst", "library/howto.rst"}
    assert r.search("files", k=3, where=["path=nowhere/*"]) == []
    scoped = Retriever.from_settings(index, NO_RERANK.replace(where=("path=library",)))
    assert all(h.chunk.path.startswith("library/") for h in scoped.search(query, k=3))
    assert scoped.search(query, k=3, mode="dense", where=[]) == top


def test_rag_search_cli_where(index, capsys):
    argv = [
        "read a file",
        "--index",
        index,
        "--rerank",
        "none",
        "--where",
        "path=library/*",
        "--where",
        "type=md",
        "--k",
        "3",
        "--json",
    ]
    assert search_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["where"] == ["path=library/*", "type=md"] and len(out["hits"]) == 3
    assert all(h["path"].startswith("library/") and h["path"].endswith(".md") for h in out["hits"])
    assert search_main(["q", "--index", index, "--where", "colour=red"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rag.search: error: ") and "'colour'" in line


# ---------------------------------------------------------------------- the HTTP API's rag.filter


def test_api_request_filter_reaches_the_pipeline():
    from fastapi.testclient import TestClient
    from serve_support import ScriptedPipeline

    from rag.serve.app import create_app
    from rag.storage.paths import indexes_dir

    listed_index(indexes_dir() / "filtered-api")
    built: list[ScriptedPipeline] = []

    def factory(cfg):
        built.append(ScriptedPipeline(cfg))
        return built[-1]

    app = create_app(RAGConfig.of(index="filtered-api"), factory)
    body = {"model": "rag", "messages": [{"role": "user", "content": "How do I open a file?"}]}
    with TestClient(app) as client:
        ok = client.post(
            "/v1/chat/completions",
            json={**body, "rag": {"filter": {"path": "library/*", "type": ["md", "rst"]}}},
        )
        assert ok.status_code == 200, ok.text
        assert built[0].calls[-1]["where"] == Where.parse(["path=library/*", "type=md,rst"])
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert "where" not in built[0].calls[-1]  # none given: the server's own --where
        for bad, said in (
            ({"filter": ["colour=red"]}, "'colour'"),
            ({"filter": ["type=pdff"]}, "'pdff'"),
            ({"filters": ["type=pdf"]}, "rag.filters"),
        ):
            r = client.post("/v1/chat/completions", json={**body, "rag": bad})
            assert r.status_code == 400, r.text
            assert said in r.json()["error"]["message"]
    assert len(built[0].calls) == 2  # refused requests never reached the pipeline


def test_pipeline_passes_the_filter_to_the_retriever(index):
    from rag.pipeline import RAGPipeline

    class Recorder:
        def __init__(self):
            self.inner, self.seen = Retriever.from_settings(index, NO_RERANK), []

        def search(self, query, k=5, mode="hybrid", **kw):
            self.seen.append(kw)
            return self.inner.search(query, k=k, mode=mode, **kw)

    rec = Recorder()
    pipe = RAGPipeline(RAGConfig.of(index=index, rerank="none"), retriever=rec, generator=object())
    hits = pipe.retrieve("read files", k=3, where=["type=rst"])
    assert rec.seen[-1] == {"where": ["type=rst"]} and {h.chunk.path for h in hits} <= {
        "errors.rst",
        "library/howto.rst",
    }
    pipe.retrieve("read files", k=3)
    assert rec.seen[-1] == {}  # no filter named: the retriever's settings decide
    assert pipe.retrieve("x", k=2, where=["path=nowhere"]) == []


# ---------------------------------------------------------------------- bounds (issue 47, case 7)


def test_a_filter_is_bounded_on_every_front_end(tmp_path, tiny_mlm_dir, capsys):
    """10,000 `--where 'path=*'` clauses took 30 s on the CLI, a minute over MCP and held an
    answer slot for 54 s in a chat request. Now one FilterError names the bound, before any
    clause is matched: the library, rag.search, the API (a 400 that never takes a slot) and
    MCP (the tool's error)."""
    from types import SimpleNamespace

    import anyio
    from fastapi.testclient import TestClient
    from serve_support import ScriptedPipeline

    from rag.retrieval.filters import MAX_CLAUSES, MAX_FILTER_CHARS, MAX_VALUES
    from rag.serve.app import create_app
    from rag.storage.paths import indexes_dir

    many = ["path=*"] * 10_000
    for spec, said in (
        (many, "at most 16 clauses (--where), not 10,000"),
        (["type=" + ",".join(["md"] * (MAX_VALUES + 1))], f"at most {MAX_VALUES} values"),
        ({"path": ["x" * 300] * 15}, f"at most {MAX_FILTER_CHARS:,} characters"),
    ):
        with pytest.raises(FilterError, match=re.escape(said)):
            Where.parse(spec)
    assert Where.parse(["path=*"] * MAX_CLAUSES)  # up to the bound, as before
    docs = write_docs(tmp_path / "docs", DOCS)
    ingest([docs], index="bounded", encoder=str(tiny_mlm_dir), progress=False)
    capsys.readouterr()
    argv = ["zebra", "--index", "bounded", "--rerank", "none"]
    assert search_main([*argv, *(a for _ in range(10_000) for a in ("--where", "path=*"))]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rag.search: error: ") and "at most 16 clauses" in line

    listed_index(indexes_dir() / "bounded-api")
    built: list[ScriptedPipeline] = []

    def factory(cfg: RAGConfig) -> ScriptedPipeline:
        built.append(ScriptedPipeline(cfg))
        return built[-1]

    app = create_app(RAGConfig.of(index="bounded-api"), factory)
    body = {"model": "rag", "messages": [{"role": "user", "content": "How do I open a file?"}]}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json={**body, "rag": {"filter": many}})
        assert r.status_code == 400 and "at most 16 clauses" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "rag.filter"
    assert not built or not built[0].calls

    from mcp.server.mcpserver.exceptions import ToolError

    from rag.mcp import create_server

    server = create_server(
        RAGConfig.of(index="bounded"),
        lambda cfg: SimpleNamespace(retriever=Retriever(cfg.index)),
    )

    async def call() -> None:
        with pytest.raises(ToolError, match="at most 16 clauses"):
            await server.call_tool("search", {"query": "zebra", "where": many})

    anyio.run(call)
