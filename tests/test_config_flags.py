"""One flag builder for every entry point: each setting of each section (rag.config) is a flag of
``rag.ask``, ``rag.search``, ``rag.serve``, ``rag.mcp`` and ``ui.app``, or is excluded there
with a stated reason; and ``--fusion rrf --alpha 0.3`` given to ``rag.ask``, ``rag.serve`` and
``rag.mcp`` (the real MCP server, through the SDK's client) retrieves the passages ``rag.search``
gives with the same flags, on a real index (the tiny encoder)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from ingest_support import DOCS, write_docs

from rag import search
from rag.config import config_from_args, field_sections
from rag.ingest import ingest

REPO = Path(__file__).resolve().parents[1]
QUERY = "how do I read a file line by line"
RETRIEVAL_FLAGS = ["--fusion", "rrf", "--alpha", "0.3", "--k", "3", "--rerank", "none"]


def entry_points():
    """name -> (parser builder, its EXCLUDED dict)."""
    import rag.ask
    import rag.mcp
    import rag.serve.app
    import ui.config

    return {
        "rag.ask": (rag.ask.build_parser, rag.ask.EXCLUDED),
        "rag.search": (search.build_parser, search.EXCLUDED),
        "rag.serve": (rag.serve.app.build_parser, rag.serve.app.EXCLUDED),
        "rag.mcp": (rag.mcp.build_parser, rag.mcp.EXCLUDED),
        "ui.app": (ui.config.build_parser, ui.config.EXCLUDED),
    }


@pytest.mark.parametrize("name", ["rag.ask", "rag.search", "rag.serve", "rag.mcp", "ui.app"])
def test_every_setting_is_a_flag_or_excluded_with_a_reason(name):
    build, excluded = entry_points()[name]
    parser = build()
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for setting in field_sections():
        flag = "--" + setting.replace("_", "-")
        if setting in excluded:
            assert excluded[setting].strip(), f"{name} excludes {setting} without a reason"
        else:
            assert flag in flags, f"{name} has no {flag} and does not say why"


def test_search_excludes_only_what_it_cannot_use():
    assert set(search.EXCLUDED) == {
        n for n, s in field_sections().items() if s in ("answer", "generate")
    }


def test_search_takes_the_index_and_retrieval_of_rag_toml_as_ask_does(tmp_path, monkeypatch):
    """./rag.toml (or --config) gives rag.search the index and the retrieval settings rag.ask
    gets; a flag wins over the file; --index-dir replaces the index, never beside --index."""
    import rag.ask

    (tmp_path / "rag.toml").write_text('index = "docs"\n[retrieval]\nfusion = "rrf"\nk = 4\n')
    monkeypatch.chdir(tmp_path)
    args = search.build_parser().parse_args([QUERY, "--alpha", "0.3"])
    index, settings = search.search_settings(args)
    ask = config_from_args(rag.ask.build_parser().parse_args([QUERY, "--alpha", "0.3"]))
    assert (index, settings) == (ask.index, ask.retrieval)
    assert (settings.fusion, settings.k, settings.alpha) == ("rrf", 4, 0.3)
    folder = search.build_parser().parse_args([QUERY, "--index-dir", str(tmp_path)])
    assert search.search_settings(folder)[0] == tmp_path
    both = search.build_parser().parse_args([QUERY, "--index", "x", "--index-dir", "y"])
    with pytest.raises(ValueError, match="not both"):
        search.search_settings(both)


@pytest.fixture
def fusion_index(tmp_path, tiny_mlm_dir):
    ingest([write_docs(tmp_path / "docs", DOCS)], index="fuse", encoder=str(tiny_mlm_dir))
    return "fuse"


def searched(index: str, capsys) -> list[tuple[str, float]]:
    assert search.main([QUERY, "--index", index, *RETRIEVAL_FLAGS, "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    return [(h["id"], round(h["score"], 6)) for h in hits]


def retrieved(pipeline) -> list[tuple[str, float]]:
    return [(h.chunk.id, round(h.score, 6)) for h in pipeline.retrieve(QUERY)]


def test_fusion_flags_retrieve_alike_through_ask_serve_and_search(fusion_index, capsys):
    import rag.ask
    import rag.serve.app
    from rag.pipeline import RAGPipeline
    from rag.serve.state import decoder_sharing_factory

    want = searched(fusion_index, capsys)
    assert len(want) == 3
    argv = ["--index", fusion_index, *RETRIEVAL_FLAGS]
    ask_cfg = config_from_args(rag.ask.build_parser().parse_args([QUERY, *argv]))
    serve_cfg = config_from_args(rag.serve.app.build_parser().parse_args(argv))
    for cfg in (ask_cfg, serve_cfg):
        assert (cfg.retrieval.fusion, cfg.retrieval.alpha) == ("rrf", 0.3)
    assert retrieved(RAGPipeline(ask_cfg)) == want
    assert retrieved(decoder_sharing_factory()(serve_cfg)) == want
    # and the flags changed the result: the default fusion ranks otherwise here
    default = config_from_args(rag.ask.build_parser().parse_args([QUERY, "--index", fusion_index]))
    scores = [s for _, s in retrieved(RAGPipeline(default))]
    assert scores != [s for _, s in want]


@pytest.mark.server
@pytest.mark.slow  # an MCP server process (test_mcp starts one in the fast suite)
def test_fusion_flags_retrieve_alike_through_the_mcp_server(fusion_index, capsys, tmp_path):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    want = searched(fusion_index, capsys)
    argv = ["-m", "rag.mcp", "--index", fusion_index, *RETRIEVAL_FLAGS]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # RAG_HOME: the test's own (conftest)

    async def call() -> dict:
        params = StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=REPO)
        log = (tmp_path / "mcp.log").open("w")  # the server's stderr: a real file
        async with (
            stdio_client(params, errlog=log) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("search", {"query": QUERY, "k": 3})
            assert not result.is_error, result.content
            return result.structured_content

    got = anyio.run(call)["passages"]
    assert [(p["chunk_id"], round(p["score"], 6)) for p in got] == want
