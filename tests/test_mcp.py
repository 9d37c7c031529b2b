"""``python -m rag.mcp`` through the official ``mcp`` SDK's own client, in a subprocess, over
stdio and over streamable HTTP: list the tools, call ``search`` (with a filter) and ``ask``,
list and read the documents as resources; a bad argument is an MCP error and the server goes
on; the HTTP transport asks for the key as rag.serve does. The index is real (the tiny encoder);
``ask`` runs the real RAGPipeline with the tiny from-scratch decoder (its words are noise, the
answer's shape is what is checked)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from ingest_support import DOCS, write_docs

from rag.ingest import ingest, remove_documents

pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[1]
KEY = "mcp-test-key"
LIBRARY = {"library/io.md": "# IO\n\nThe io module reads files line by line.\n"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_mlm_dir, tiny_clm_dir):
    """(index, docs folder, server argv) over a fresh index; RAG_HOME as the tests' own."""
    from ui_support import module_rag_home

    with module_rag_home(tmp_path_factory) as home:
        docs = write_docs(tmp_path_factory.mktemp("mcp") / "docs", {**DOCS, **LIBRARY})
        ingest([docs], index="mcptest", encoder=str(tiny_mlm_dir), progress=False)
        argv = [
            "-m", "rag.mcp", "--index", "mcptest", "--decoder", str(tiny_clm_dir),
            "--adapter", "none", "--reader", "none", "--rerank", "none",
            "--answerability-threshold", "none", "--max-new-tokens", "8",
        ]  # fmt: skip
        env = {**os.environ, "RAG_HOME": str(home), "HF_HUB_OFFLINE": "1"}
        env.pop("RAG_API_KEY", None)
        yield "mcptest", docs, argv, env


def structured(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


async def round_trip(session: ClientSession, docs: Path) -> None:
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"search", "ask"}
    props = tools["search"].input_schema["properties"]
    assert set(props) == {"query", "k", "where"} and props["k"]["maximum"] == 50

    found = structured(await session.call_tool("search", {"query": "zebra stripes", "k": 2}))
    assert len(found["passages"]) == 2 and found["generation"] == "gen-000001"
    assert found["query"] == "zebra stripes"
    typo = structured(await session.call_tool("search", {"query": "read a fiel", "k": 1}))
    assert typo["query"] == "read a file"  # searched as `ask` would (rag.retrieval.spelling)
    for p in found["passages"]:
        assert set(p) == {"rank", "path", "heading", "score", "chunk_id", "text"}
        assert not p["path"].startswith("/") and str(docs) not in p["text"]
    lib = structured(
        await session.call_tool("search", {"query": "zebra", "k": 3, "where": ["path=library"]})
    )
    assert [p["path"] for p in lib["passages"]] == ["library/io.md"]

    for bad, said in (
        ({"query": "x", "k": 0}, "k"),
        ({"query": "x", "where": ["colour=red"]}, "colour"),
    ):
        result = await session.call_tool("search", bad)
        assert result.is_error and said in result.content[0].text
    result = await session.call_tool("ask", {"question": ""})
    assert result.is_error

    answer = structured(await session.call_tool("ask", {"question": "Where do zebras live?"}))
    assert set(answer) == {"answer", "refused", "sources", "answer_span", "generation"}
    # the tiny decoder's words are noise (often none); the pipeline ran and said what it cited
    assert isinstance(answer["answer"], str) and isinstance(answer["refused"], bool)
    assert answer["generation"] == "gen-000001" and answer["answer_span"] is None  # no reader
    assert answer["refused"] or answer["sources"], answer
    for s in answer["sources"]:
        assert not s["path"].startswith("/")

    resources = {r.name: r for r in (await session.list_resources()).resources}
    assert set(resources) == {*DOCS, *LIBRARY}
    notes = await session.read_resource(resources["notes.txt"].uri)
    assert "Zebras and giraffes" in notes.contents[0].text
    with pytest.raises(Exception, match="no document"):
        await session.read_resource("rag://documents/nope.md")
    again = structured(await session.call_tool("search", {"query": "zebra", "k": 1}))
    assert len(again["passages"]) == 1  # the server went on after the errors


def test_stdio_round_trip(served):
    _, docs, argv, env = served
    params = StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=str(REPO))

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await round_trip(session, docs)

    anyio.run(main)


def free_port() -> int:
    from ui_support import free_port as port

    return port()


@asynccontextmanager
async def http_session(url: str, key: str | None):
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as client,
        streamable_http_client(url, http_client=client) as (read, write, *_),
        ClientSession(read, write) as session,
    ):
        yield session


def test_streamable_http_needs_the_key(served):
    _, docs, argv, env = served
    port = free_port()
    cmd = [sys.executable, *argv, "--transport", "http", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, env={**env, "RAG_API_KEY": KEY}, cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                r = httpx.post(url, json={}, timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "rag.mcp did not start"
                time.sleep(0.3)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.post(url, json={}, headers={"Authorization": "Bearer nope"}, timeout=5)
        assert wrong.status_code == 401

        async def main() -> None:
            async with http_session(url, KEY) as session:
                await round_trip(session, docs)

        anyio.run(main)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bad_command_lines_are_one_line(served, capsys):
    from rag.mcp import main

    assert main(["--index", "no-such-index"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rag.mcp: error: ") and "'no-such-index'" in err[-1]
    with pytest.raises(SystemExit) as refused:
        main(["--transport", "carrier-pigeon"])
    assert refused.value.code == 2 and "--transport" in capsys.readouterr().err


def test_tool_errors_hide_the_servers_paths(tmp_path, monkeypatch):
    """What an MCP client reads of a failed tool call names the index and the file inside it,
    never where the server keeps them (as rag.serve's errors; docs/security.md)."""
    from mcp.server.mcpserver.exceptions import ToolError

    from rag.mcp import readable_errors
    from rag.storage.paths import indexes_dir

    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    current = indexes_dir() / "docs" / "CURRENT"
    outside = tmp_path / "models" / "model.safetensors"

    def fail(exc: Exception):
        def call():
            raise exc

        return readable_errors(call)

    with pytest.raises(ToolError) as err:
        fail(OSError(f"cannot read {current}: permission denied"))()
    said = str(err.value)
    assert "docs/CURRENT" in said and str(tmp_path) not in said, said
    with pytest.raises(ToolError) as err:
        fail(LookupError(f"no model at '{outside}'\nsee the docs"))()
    said = str(err.value)
    assert "model.safetensors" in said and str(tmp_path) not in said and "\n" not in said, said
    with pytest.raises(ZeroDivisionError):  # other errors pass as they are (the SDK hides them)
        fail(ZeroDivisionError(str(current)))()


def test_two_folders_with_the_same_name_are_two_resources(tmp_path, tiny_mlm_dir):
    """Issue 47, case 8: dupA/same.md and dupB/same.md were listed as two resources with one
    URI, both serving A's text. Now each has its own URI and text; a root, an absolute or a
    backslash path is no resource (the one check rag.docs and the API make). Case 16: once
    dupA/same.md is removed, dupB's (now same.md) is still the resource dupB/same.md."""
    from types import SimpleNamespace

    from mcp.server.mcpserver.exceptions import ResourceNotFoundError

    from rag.config import RAGConfig
    from rag.mcp import URI_PREFIX, create_server
    from rag.retrieval.retriever import Retriever

    a = write_docs(tmp_path / "dupA", {"same.md": "# Same\n\nAardvarks dig burrows.\n"})
    b = write_docs(tmp_path / "dupB", {"same.md": "# Same\n\nBadgers dig setts.\n"})
    name = f"dup-{tmp_path.name}"
    ingest([a, b], index=name, encoder=str(tiny_mlm_dir), progress=False)
    server = create_server(
        RAGConfig.of(index=name), lambda cfg: SimpleNamespace(retriever=Retriever(cfg.index))
    )

    async def main() -> None:
        resources = await server.list_resources()
        uris = {r.name: str(r.uri) for r in resources}
        assert uris == {
            "dupA/same.md": URI_PREFIX + "dupA/same.md",
            "dupB/same.md": URI_PREFIX + "dupB/same.md",
        }
        for path, word in (("dupA/same.md", "Aardvarks"), ("dupB/same.md", "Badgers")):
            [content] = await server.read_resource(uris[path])
            assert word in content.content and "same.md" not in content.content
        for bad in ("same.md", "%5C", "%2F", ".", "%5Ctmp%5Cx", str(a / "same.md")):
            with pytest.raises(ResourceNotFoundError):
                await server.read_resource(URI_PREFIX + bad)
        # case 16: once dupA's is removed, dupB's is same.md, and its earlier name still works
        remove_documents(name, ["dupA/same.md"])
        assert [r.name for r in await server.list_resources()] == ["same.md"]
        for path in ("same.md", "dupB/same.md"):
            [content] = await server.read_resource(URI_PREFIX + path)
            assert "Badgers" in content.content
        with pytest.raises(ResourceNotFoundError):
            await server.read_resource(URI_PREFIX + "dupA/same.md")

    anyio.run(main)
