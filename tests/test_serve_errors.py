"""``rag.serve``'s failures as clients see them: the key, the OpenAI error shape for bad,
malformed, oversized and failing requests (never a traceback or a server path), and a client
that disconnects mid-answer (its decoding is cancelled, its slot freed). The server:
``serve_support.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from serve_support import (
    ANSWER,
    KEY,
    LIMIT,
    MAX_BODY,
    Server,
    ask,
    in_flight,
    started_server,
)

from rag.serve.app import ServeOptions
from rag.storage.paths import rag_home

pytestmark = pytest.mark.server
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with started_server(tmp_path_factory) as s:
        yield s


# ---- errors ------------------------------------------------------------------------------------


def test_key_is_required_on_v1(server):
    import openai

    r = server.post("/v1/chat/completions", key=None, json={"model": "rag:docs", "messages": ask()})
    assert r.status_code == 401
    assert r.json() == {
        "error": {
            "message": r.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # probes need no key
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(key="wrong").chat.completions.create(model="rag:docs", messages=ask())
    assert e.value.code == "invalid_api_key"


def test_bad_requests_get_the_openai_error_shape(server):
    import openai

    client = server.client()
    cases = [
        ({"messages": []}, "messages"),
        ({"max_tokens": LIMIT + 1}, "max_tokens"),
        ({"max_completion_tokens": LIMIT + 1}, "max_completion_tokens"),
        ({"messages": [*ask(), {"role": "assistant", "content": "hi"}]}, "messages"),
        ({"messages": ask("   ")}, "messages"),
        ({"temperature": 3}, "temperature"),
        ({"n": 2}, "n"),
        ({"extra_body": {"mode": "psychic"}}, "mode"),
    ]
    for override, param in cases:
        kwargs = {"model": "rag:docs", "messages": ask(), **override}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kwargs)
        assert e.value.status_code == 400 and e.value.param == param, override
        assert set(e.value.body) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError, match=f"limit of {LIMIT}"):
        client.chat.completions.create(model="rag:docs", messages=ask(), max_tokens=LIMIT + 1)
    for model in ("gpt-4o", "rag:nope", "rag:../etc"):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model=model, messages=ask())
        assert e.value.code == "model_not_found" and "rag:docs" in e.value.message


def test_malformed_oversized_and_failing_requests_never_leak_internals(server):
    cases = [
        (server.post("/v1/chat/completions", content=b"{not json"), 400),
        (server.post("/v1/chat/completions", json={"messages": ask()}), 400),
        (server.post("/v1/chat/completions", content=b"x" * (MAX_BODY + 1)), 413),
        (server.post("/v1/nope", json={}), 404),
        (server.post("/v1/chat/completions", json={"model": "rag:broken", "messages": ask()}), 500),
    ]
    for r, status in cases:
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"message", "type", "param", "code"}  # fmt: skip
        assert "Traceback" not in r.text and "secret" not in r.text
    assert cases[1][0].json()["error"]["param"] == "model"
    assert cases[4][0].json()["error"]["type"] == "server_error"


def test_client_errors_are_400_not_500(server):
    """What the client got wrong is a 400 in the OpenAI shape (openai clients retry a 5xx): a
    lone surrogate escape, a question over max_question_chars or over the decoder's context,
    a question without a word."""
    import openai

    body = b'{"model": "rag:docs", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = server.post("/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == "messages.0.content"
    assert "surrogate" in err["message"] and err["type"] == "invalid_request_error"
    body = b'{"model": "rag:docs", "input": ["\\udfff"]}'
    r = server.post("/v1/embeddings", content=body, headers=JSON)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.0"
    client = server.client()
    limit = ServeOptions().max_question_chars
    cases = [
        ("rag:docs", "x" * 200_000, "string_above_max_length", f"limit of {limit}"),
        ("rag:docs", "x" * (limit + 1), "string_above_max_length", f"{limit + 1} characters"),
        ("rag:tiny", "open " * 700, "context_length_exceeded", "the question alone takes"),
        ("rag:docs", "???", None, "no word"),
        ("rag:docs", " ... !", None, "no word"),
    ]
    for model, question, code, says in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=ask(question))
        assert e.value.status_code == 400 and e.value.param == "messages", question[:20]
        assert e.value.code == code and says in e.value.message, e.value.message
    assert client.chat.completions.create(model="rag:docs", messages=ask("x" * limit))


def test_errors_name_the_index_never_a_server_path(server):
    """A damaged index fails with a message naming it by name (the server log keeps the path);
    a folder without a published generation is no model at all."""
    home = str(rag_home())
    r = server.post("/v1/chat/completions", json={"model": "rag:damaged", "messages": ask()})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    message = r.json()["error"]["message"]
    assert "damaged/CURRENT" in message and "gen-000009" in message, message
    assert home not in r.text and str(rag_home().resolve()) not in r.text
    r = httpx.get(
        server.url + "/v1/documents",
        params={"model": "rag:damaged"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 500 and "damaged/CURRENT" in r.text and home not in r.text
    r = server.post("/v1/chat/completions", json={"model": "rag:unpublished", "messages": ask()})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert home not in r.text


# ---- disconnects and slots ---------------------------------------------------------------------


def test_client_disconnect_cancels_generation_and_frees_the_slot(server):
    import openai

    client = server.client()
    stream = client.chat.completions.create(model="rag:slow", messages=ask(), stream=True)
    pieces = iter(stream)
    next(pieces), next(pieces)  # role chunk, first piece: the answer is under way
    slow = server.built["slow"]
    assert in_flight(server) == 1
    with pytest.raises(openai.RateLimitError) as e:  # max_concurrent=1: the one slot is taken
        client.chat.completions.create(model="rag:docs", messages=ask())
    assert e.value.status_code == 429 and e.value.code == "server_busy"
    stream.close()  # the client goes away mid-answer
    assert slow.cancelled.wait(10), "the pipeline's stream was not closed"
    deadline = time.monotonic() + 10
    while in_flight(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_flight(server) == 0
    resp = client.chat.completions.create(model="rag:docs", messages=ask())
    assert resp.choices[0].message.content == ANSWER


# ---- issue 47, case 11: accepted and ignored ----------------------------------------------------


def test_parameters_it_cannot_honour_are_refused_not_ignored(server):
    """`stop`, `response_format`, `logprobs`, `tool_choice` and `functions` returned 200 and
    were ignored (the stop string was not honoured) while `n > 1` and `tools` were refused.
    Now each is a 400 naming it unless empty or its default, which still answer."""
    import openai

    client = server.client()
    cases = [
        ({"stop": ["\n"]}, "stop"),
        ({"stop": "Answer"}, "stop"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"extra_body": {"top_logprobs": 3}}, "top_logprobs"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"extra_body": {"functions": [{"name": "f", "parameters": {}}]}}, "functions"),
        ({"extra_body": {"function_call": "auto"}}, "function_call"),
    ]
    for override, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="rag:docs", messages=ask(), **override)
        assert e.value.param == param and e.value.code == "unsupported_parameter", override
    defaults = {
        "stop": [],
        "response_format": {"type": "text"},
        "logprobs": False,
        "tool_choice": "none",
    }
    done = client.chat.completions.create(model="rag:docs", messages=ask(), **defaults)
    assert done.choices[0].message.content == ANSWER


def test_embeddings_refuse_what_the_encoder_would_cut(tmp_path, tiny_mlm_dir):
    """/v1/embeddings with one 900 KB input reported prompt_tokens 180,000 while the encoder
    read 256: now an input over what the encoder reads is a 400 naming it; under it, usage is
    the tokens read."""
    from fastapi.testclient import TestClient
    from ingest_support import write_docs
    from serve_support import KEY

    from rag.config import RAGConfig
    from rag.ingest import ingest
    from rag.retrieval.retriever import Retriever
    from rag.serve.app import create_app

    name = f"emb-{tmp_path.name}"
    ingest([write_docs(tmp_path / "docs")], index=name, encoder=str(tiny_mlm_dir), progress=False)

    class Pipe:
        def __init__(self, cfg: RAGConfig) -> None:
            self.retriever = Retriever(cfg.index)

    app = create_app(RAGConfig.of(index=name), Pipe, options=ServeOptions(api_key=KEY))
    auth = {"Authorization": f"Bearer {KEY}"}
    with TestClient(app) as client:
        encoder = app.state.rag.pipelines.get(name).retriever.encoder
        limit = encoder.max_chunk_tokens
        r = client.post(
            "/v1/embeddings",
            json={"model": "rag", "input": ["short", "zebra " * 50_000]},
            headers=auth,
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "input" and err["code"] == "context_length_exceeded"
        assert (
            err["message"].startswith("input 1 is ")
            and f"tokens, over the {limit}" in err["message"]
        )
        r = client.post(
            "/v1/embeddings", json={"model": "rag", "input": "zebra stripes"}, headers=auth
        )
        assert r.status_code == 200 and 0 < r.json()["usage"]["prompt_tokens"] <= limit


def test_embeddings_count_a_run_without_spaces_as_ingest_does(tmp_path):
    """A WordPiece encoder (minilm) reads a run of more than 100 characters without a space as
    one [UNK]: a 200 KB such input was accepted, 'prompt_tokens: 1', and embedded as the vector
    of "unknown". Counted as ingest counts a chunk (rag.documents.chunking.MAX_TOKEN_CHARS: one
    token per 32 characters of it), it is a 400 naming the input and the run; a short run
    passes, and usage is still the tokens the encoder reads (the [UNK] is one)."""
    import numpy as np
    from fastapi.testclient import TestClient
    from ingest_support import listed_index
    from serve_support import KEY
    from transformers import AutoTokenizer

    from rag.config import RAGConfig
    from rag.models import minilm_path
    from rag.serve.app import create_app
    from rag.storage.paths import indexes_dir

    class WordPieceEncoder:  # minilm's tokenizer and limit; no model loaded
        dim = 4
        max_chunk_tokens = 254
        document_prompt = query_prompt = ""
        tokenizer = AutoTokenizer.from_pretrained(minilm_path())

        def encode(self, texts: list[str], kind: str = "document") -> np.ndarray:
            return np.ones((len(texts), self.dim), dtype=np.float32)

    class Pipe:
        def __init__(self, cfg: RAGConfig) -> None:
            self.retriever = type("R", (), {"encoder": WordPieceEncoder()})()

    name = f"wp-{tmp_path.name}"
    listed_index(indexes_dir() / name)
    app = create_app(RAGConfig.of(index=name), Pipe, options=ServeOptions(api_key=KEY))
    auth = {"Authorization": f"Bearer {KEY}"}
    with TestClient(app) as client:
        spaceless = "a" * 200_000
        r = client.post(
            "/v1/embeddings", json={"model": "rag", "input": ["short", spaceless]}, headers=auth
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "input" and err["code"] == "context_length_exceeded"
        assert err["message"] == (
            "input 1 is 6,250 tokens as ingest counts them, over the 254 this index's encoder "
            "reads: a run of 200,000 characters without a space, which the encoder reads as one "
            "token (ingest cuts such runs every 32 characters); split it"
        )
        r = client.post(
            "/v1/embeddings", json={"model": "rag", "input": "zebra " + "x" * 150}, headers=auth
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 2  # 'zebra' and one [UNK]
