"""``rag.serve`` through real clients: the server runs under uvicorn on a free loopback port and
the ``openai`` client and LangChain's ``ChatOpenAI`` talk to it over HTTP (the server and its
scripted pipelines: ``serve_support.py``). Errors, limits and disconnects: test_serve_errors.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from serve_support import (
    ANSWER,
    CHUNK,
    FOLLOW_UP,
    KEY,
    LIMIT,
    PIECES,
    REWRITTEN,
    SECRET_ROOT,
    Server,
    ask,
    started_server,
)

from rag.answer.prompt import REFUSAL
from rag.serve.app import main
from rag.types import Answer, Chunk, Citation, Hit

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with started_server(tmp_path_factory) as s:
        yield s


# ---- chat completions --------------------------------------------------------------------------


def test_completion_keeps_markers_and_carries_sources(server):
    client = server.client()
    resp = client.chat.completions.create(model="rag:docs", messages=ask())
    assert resp.choices[0].message.content == ANSWER
    assert resp.choices[0].finish_reason == "stop" and resp.model == "rag:docs"
    assert resp.usage.completion_tokens == 5
    (src,) = resp.model_extra["sources"]
    assert src == {
        "number": 1,
        "path": "files.md",
        "heading_path": ["Python files", "Opening a file"],
        "chunk_id": "files-0",
        "score": pytest.approx(0.9),
        "text": CHUNK.text,
        "supported": True,
    }
    assert resp.model_extra["rag"]["query"] == "How do I open a file?"
    raw = client.chat.completions.with_raw_response.create(model="rag:docs", messages=ask())
    body = raw.http_response.json()
    assert body["sources"][0]["path"] == "files.md"
    assert SECRET_ROOT not in raw.http_response.text


def test_stream_sends_pieces_then_sources_and_done(server):
    client = server.client()
    chunks = list(
        client.chat.completions.create(
            model="rag:docs", messages=ask(), stream=True, stream_options={"include_usage": True}
        )
    )
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(deltas) == ANSWER and len(deltas) == len(PIECES)
    (final,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert final.choices[0].finish_reason == "stop"
    assert final.model_extra["sources"][0]["number"] == 1
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].choices == []
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "rag:docs", "messages": ask(), "stream": True},
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert "sources" in json.loads(lines[-2].removeprefix("data: "))


def prompt_tokens(server: Server, index: str, question: str) -> int:
    """The tokens of the prompt the index's pipeline decodes ``question`` from (its decoder's
    own tokenizer), computed apart from the server's answer."""
    pipe = server.built[index]
    ids, _ = pipe.generator.prompt_ids(pipe.prepare(question).messages)
    return len(ids)


@pytest.mark.parametrize("index", ["tiny", "tiny-batched"])
def test_usage_and_finish_reason_are_the_decoders(server, index):
    """max_tokens=5 cuts the tiny decoder's answer: finish_reason "length" and 5 completion
    tokens, streamed or not, batched or not; the usage chunk comes last, only when asked."""
    client, model, question = server.client(), f"rag:{index}", "How do I open a file?"
    resp = client.chat.completions.create(model=model, messages=ask(question), max_tokens=5)
    n = prompt_tokens(server, index, question)
    want = {"prompt_tokens": n, "completion_tokens": 5, "total_tokens": n + 5}
    assert resp.choices[0].finish_reason == "length" and resp.choices[0].message.content
    assert {k: getattr(resp.usage, k) for k in want} == want
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=ask(question),
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    (final,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert final.choices[0].finish_reason == "length"
    *rest, last = chunks
    assert last.choices == [] and {k: getattr(last.usage, k) for k in want} == want
    assert all(c.choices and c.usage is None for c in rest)
    plain = list(
        client.chat.completions.create(
            model=model, messages=ask(question), max_tokens=5, stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in plain)  # no usage chunk unless asked
    assert [c.choices[0].finish_reason for c in plain if c.choices[0].finish_reason] == ["length"]


def test_an_answer_that_ends_itself_is_stop_with_its_tokens(server):
    """The decoder ended the answer (eos) before max_tokens: "stop", its one token counted;
    an answer nothing was decoded for (the refusal) reports "stop" and zero tokens."""
    client, question = server.client(), "How do I open a file?"
    resp = client.chat.completions.create(model="rag:tiny-eos", messages=ask(question))
    n = prompt_tokens(server, "tiny-eos", question)
    assert resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (n, 1)
    chunks = list(
        client.chat.completions.create(
            model="rag:tiny-eos",
            messages=ask(question),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 1 and chunks[-1].usage.total_tokens == n + 1
    resp = client.chat.completions.create(model="rag:empty", messages=ask(), max_tokens=5)
    assert resp.choices[0].message.content == REFUSAL  # longer than 5 tokens, not decoded
    assert resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (0, 0)


def test_history_is_rewritten_and_parameters_mapped(server):
    client = server.client()
    resp = client.chat.completions.create(
        model="rag:docs",
        messages=FOLLOW_UP,
        max_tokens=32,
        temperature=0.7,
        extra_body={"k": 2, "mode": "bm25"},
    )
    call = server.built["docs"].calls[-1]
    assert call["question"] == "and how do I close it?"
    assert call["history"] == FOLLOW_UP[1:3]  # the system message is not history
    assert call["max_new_tokens"] == 32 and call["temperature"] == 0.7
    assert call["k"] == 2 and call["mode"] == "bm25"
    assert resp.model_extra["rag"]["query"] == REWRITTEN
    client.chat.completions.create(model="rag", messages=ask())  # "rag" = the server's --index
    call = server.built["docs"].calls[-1]
    assert call["max_new_tokens"] == LIMIT and call["temperature"] is None and call["k"] is None


def test_real_pipeline_behind_the_api(server):
    client = server.client()
    resp = client.chat.completions.create(model="rag:real", messages=FOLLOW_UP)
    assert resp.choices[0].message.content == ANSWER
    assert resp.model_extra["rag"]["query"] == REWRITTEN  # RAGPipeline ran the UI's rewrite
    assert [s["path"] for s in resp.model_extra["sources"]] == ["files.md"]
    stream = client.chat.completions.create(model="rag:real", messages=ask(), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ANSWER
    resp = client.chat.completions.create(model="rag:empty", messages=ask())
    assert resp.choices[0].message.content == REFUSAL  # nothing retrieved: no decoder call
    assert resp.model_extra["sources"] == [] and resp.model_extra["rag"]["refused"] is True


def test_verification_fields_reach_the_client(server):
    from rag.serve import api as serve_api

    # The real pipeline verifies its citations: the fields agree with each other.
    resp = server.client().chat.completions.create(model="rag:real", messages=ask())
    info, sources = resp.model_extra["rag"], resp.model_extra["sources"]
    assert [s["number"] for s in sources if not s["supported"]] == info["unsupported_citations"]
    assert info["reattributed"] == [] and info["suspected_injection"] is False
    assert info["injection_reasons"] == []
    # A hand-made verified answer: one citation moved, one flagged, an injection suspected.
    other = Chunk("files-1", "Call close() when done.", f"{SECRET_ROOT}/files.md", path="files.md")
    hits = [Hit(CHUNK, 0.9, rank=1), Hit(other, 0.5, rank=2)]
    cites = [
        Citation(1, CHUNK.source, CHUNK.heading_path, CHUNK.text, 0.9, CHUNK.id, supported=False),
        Citation(2, other.source, (), other.text, 0.5, other.id),
    ]
    answer = Answer(
        text="PWNED.",
        citations=cites,
        raw_text="PWNED [1]. Close it [1].",
        passages=hits,
        verified=True,
        unsupported_citations=[1],
        reattributed=[(1, 2)],
        suspected_injection=True,
        injection_reasons=["the answer contains 'PWNED'"],
    )
    body = json.loads(json.dumps(serve_api.completion({"id": "x"}, "PWNED", answer)))
    assert [(s["number"], s["supported"]) for s in body["sources"]] == [(1, False), (2, True)]
    assert body["rag"]["unsupported_citations"] == [1] and body["rag"]["reattributed"] == [[1, 2]]
    assert body["rag"]["suspected_injection"] is True
    assert body["rag"]["injection_reasons"] == ["the answer contains 'PWNED'"]
    (final,) = serve_api.final_chunks({"id": "x"}, answer, include_usage=False)
    assert final["rag"]["reattributed"] == [[1, 2]] and final["sources"][0]["supported"] is False


def test_langchain_chat_openai(server):
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="rag:docs", base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30
    )
    assert llm.invoke("How do I open a file?").content == ANSWER
    assert "".join(str(c.content) for c in llm.stream("How do I open a file?")) == ANSWER
    turns = [HumanMessage(FOLLOW_UP[1]["content"]), AIMessage(ANSWER), HumanMessage("and how do I close it?")]  # fmt: skip
    assert llm.invoke(turns).content == ANSWER
    assert server.built["docs"].calls[-1]["query"] == REWRITTEN


# ---- models and embeddings ---------------------------------------------------------------------


def test_models_lists_every_index(server):
    ids = {m.id for m in server.client().models.list()}
    assert {"rag:docs", "rag:slow", "rag:real", "rag:damaged"} <= ids
    assert "rag:unpublished" not in ids  # a killed first ingest's folder is no index


def test_embeddings_use_the_index_encoder(server):
    import openai

    client = server.client()
    resp = client.embeddings.create(model="rag:docs", input=["abc", "hello"])  # base64 on the wire
    assert [d.embedding for d in resp.data] == [[3.0, 0.0, 0.5, -0.25], [5.0, 0.0, 0.5, -0.25]]
    resp = client.embeddings.create(
        model="rag:docs", input="abc", encoding_format="float", extra_body={"input_type": "query"}
    )
    assert resp.data[0].embedding == [3.0, 1.0, 0.5, -0.25] and resp.model == "rag:docs"
    for kwargs in ({"input": "abc", "dimensions": 8}, {"input": [[1, 2, 3]]}, {"input": []}):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="rag:docs", **kwargs)


# ---- command line ------------------------------------------------------------------------------


def test_cli_failures_are_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no rag.toml
    assert main(["--index", "missing-index"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("rag.serve: error: index 'missing-index' does not exist") and "\n" not in err
    )
    assert main(["--index", "../escape"]) == 2
    assert "not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--port", "many"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
