"""HTTP plumbing of :mod:`rag.serve`: the key and body-size guard, the error handlers, and a
streaming response that always closes its generator.

Why a pure ASGI guard rather than FastAPI dependencies: the key must be checked and the body
bounded *before* anything reads or parses the body, for every path under ``/v1`` (an unknown
route included, so a client without the key learns nothing), and FastAPI solves dependencies
only after routing. The guard reads at most ``max_body`` bytes, then replays them to the app.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import sys
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.cli import one_line
from rag.serve.api import ApiError, error_body
from rag.storage.paths import indexes_dir, rag_home

log = logging.getLogger("rag.serve")

# Exceptions whose message is written for people (a missing index, an encoder mismatch, a bad
# model folder): their text is sent; anything else is logged and sent as a generic line.
READABLE = (ValueError, LookupError, OSError)


def readable(exc: BaseException) -> str:
    """The message a client gets for ``exc``: its own text for the errors written for people,
    with the server's paths taken out (:func:`hide_paths`), else a generic line."""
    if isinstance(exc, READABLE) and str(exc):
        return hide_paths(one_line(str(exc)))
    return f"internal error ({type(exc).__name__}); the details are in the server log"


# An absolute path in a message: "/" at the start or after a space, quote, bracket or "=", up
# to the next space, quote, bracket, comma, colon or semicolon (a message's own punctuation).
_ABSOLUTE_PATH = re.compile(r"(?<![^\s'\"(\[=])/[^\s'\"()\[\],:;]+")


def hide_paths(text: str) -> str:
    """``text`` without the server's absolute paths (docs/security.md: what the API sends never
    shows the machine's layout; the server log keeps them). A path under
    ``$RAG_HOME/indexes`` becomes the index's name and the path inside it (``docs/CURRENT``),
    one elsewhere under ``$RAG_HOME`` reads ``$RAG_HOME/...``, any other keeps its last part
    (``…/model.safetensors``)."""
    for folder, inside, itself in (
        (indexes_dir(), "", "$RAG_HOME/indexes"),
        (rag_home(), "$RAG_HOME/", "$RAG_HOME"),
    ):
        for root in dict.fromkeys((str(folder), str(folder.resolve()))):
            if os.path.isabs(root) and root != os.sep:
                text = text.replace(root + os.sep, inside).replace(root, itself)
    return _ABSOLUTE_PATH.sub(lambda m: "…/" + m.group().rstrip("/").rsplit("/", 1)[-1], text)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def warn_if_open(prog: str, host: str, api_key: str | None, what: str) -> None:
    """The start-up warning of a server bound beyond loopback without a key (stderr)."""
    if host not in LOOPBACK and not api_key:
        print(
            f"{prog}: warning: serving on {host} without --api-key: "
            f"anyone who can reach this port can query {what}",
            file=sys.stderr,
        )


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class Guard:
    """Bearer-key check for the paths under ``prefix`` (``/v1``: rag.serve's API; ``/mcp``:
    rag.mcp's streamable HTTP) and a request body limit for every request."""

    def __init__(
        self, app: ASGIApp, api_key: str | None, max_body: int, prefix: str = "/v1"
    ) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.prefix = prefix

    def _authorised(self, scope: Scope) -> bool:
        if self.api_key is None or not scope["path"].startswith(self.prefix):
            return True
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(token.strip(), self.api_key)
        return False

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"the request body is over this server's limit of {self.max_body} bytes",
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorised(scope):
            err = ApiError(
                401,
                "missing or incorrect API key: send the header 'Authorization: Bearer KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await error_response(err)(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > self.max_body:
            await error_response(self._too_large())(scope, receive, send)
            return
        body = bytearray()
        more = scope["method"] not in ("GET", "HEAD", "OPTIONS")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                await error_response(self._too_large())(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: http.disconnect when the client leaves

        await self.app(scope, replay, send)


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always ``aclose()``s its body iterator.

    Starlette cancels the streaming task when the client disconnects; if the cancel lands while
    the generator is suspended at a ``yield`` (a send in progress), the generator would only be
    finalised whenever the garbage collector gets to it, and the decoding it drives would go on.
    Closing it here runs its ``finally`` (which closes the pipeline's stream) at once.
    """

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        msg = "field required"
    return (f"{param}: {msg}" if param else msg), param


def install_error_handlers(app: FastAPI) -> None:
    """Every failure leaves as the OpenAI error shape; validation errors are 400, as OpenAI
    answers them (FastAPI's default is 422 with its own body)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        return error_response(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body(readable(exc), "server_error"), status_code=500)


def server_error(exc: BaseException) -> ApiError:
    """A pipeline failure as a 500 with a readable message (the traceback goes to the log)."""
    log.error("generation failed", exc_info=exc)
    return ApiError(500, readable(exc), type="server_error")


def stream_error(exc: BaseException) -> dict[str, Any]:
    """The event sent when a stream fails after its headers went out: openai clients raise
    ``APIError`` on a data event holding ``error``."""
    return server_error(exc).body()
