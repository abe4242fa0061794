"""The routes (docs/openai.md): each one authorizes its caller, reads its
body within bounds, hands what grows with the request to the tokenizing
thread, and runs its generation through the pipeline, as a gRPC handler
does. Errors are OpenAI's JSON error body (errors.py), also for paths that
do not exist."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import metrics
from rollout_service.http.body import read_bounded
from rollout_service.http.callers import authorize
from rollout_service.http.chat import prepare_chat
from rollout_service.http.completions import completion_response, prepare_completion
from rollout_service.http.errors import HttpError, error_body, error_response
from rollout_service.http.front import Front
from rollout_service.http.responses import chat_response
from rollout_service.http.streaming import ChatStream, CompletionStream, sse_error
from rollout_service.ops.logs import request_id as logged_request_id

VERSION_HEADER = "rollout-weight-version"


def build_api(front: Front) -> FastAPI:
    """The FastAPI app of the HTTP front, metered (metrics.py)."""
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @api.exception_handler(HTTPException)
    async def _no_route(request: Request, e: HTTPException):
        not_ours = HttpError(e.status_code, str(e.detail), reason=pb.ERROR_REASON_UNSPECIFIED)
        return error_response(not_ours, request.url.path)

    @api.get("/health")
    async def health():
        """200 while serving; 503 while starting, degraded, asleep or dying."""
        try:
            front.ready().app.served.check_serving()
        except Exception as e:
            status, body, _ = error_body(e, "/health")
            return JSONResponse(body, status_code=503 if status < 500 else status)
        return {"status": "SERVING"}

    @api.get("/v1/models")
    async def models(request: Request):
        try:
            authorize(front.tokens, request)
            app = front.ready().app
        except Exception as e:
            return error_response(e, "/v1/models")
        from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList

        base = app.info.model
        cards = [ModelCard(id=base, root=base, max_model_len=app.info.limits.max_model_len)]
        cards += [ModelCard(id=a.name, root=a.name, parent=base) for a in app.adapters.listing()]
        return JSONResponse(ModelList(data=cards).model_dump())

    @api.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _generate(front, request, "/v1/chat/completions")

    @api.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(front, request, "/v1/completions")

    return Measured(api)


async def _generate(front: Front, request: Request, route: str):
    chat = route == "/v1/chat/completions"
    prompt_field = "messages" if chat else "prompt"
    try:
        who = authorize(front.tokens, request)
        ready = front.ready()
        app = ready.app
        raw = await read_bounded(request)
        prepare = prepare_chat if chat else prepare_completion
        call = await app.tokenizing.off_loop(prepare, raw, front, app)
        logged_request_id.set(call.generate.request_id)
        model = call.request.model or app.info.model
        if call.request.stream:
            stream = await app.tokenizing.off_loop(_stream_request, call.generate)
            messages = ready.generations.stream(stream, who)
            builder = (ChatStream if chat else CompletionStream)(
                call, model, app, call.generate.request_id
            )
            return await _streamed(messages, builder, app, route)
        answer = await _until_disconnected(request, ready.generations.generate(call.generate, who))
        build = chat_response if chat else completion_response
        body = await app.tokenizing.off_loop(
            lambda: build(call, answer, model, app).model_dump_json()
        )
        return Response(
            body, media_type="application/json", headers={VERSION_HEADER: answer.weight_version}
        )
    except Exception as e:
        return error_response(e, route, prompt_field)


def _stream_request(request: pb.GenerateRequest) -> pb.GenerateStreamRequest:
    """The same request for GenerateStream (the proto keeps their fields'
    numbers equal; the copy grows with the prompt: off the loop)."""
    return pb.GenerateStreamRequest.FromString(request.SerializeToString())


async def _until_disconnected(request: Request, generation):
    """The generation's result; cancelled (its engine request aborted) if
    the client goes away first, as a gRPC call's cancellation does."""
    task = asyncio.ensure_future(generation)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise HttpError(499, "the client closed the request")
    return task.result()


async def _streamed(messages, builder, app, route: str):
    """Server-sent events of the pipeline's stream. Its first message is
    awaited here, before the response starts: a request the pipeline refuses
    (the caller's cap, a wrong weight version, bad input) gets its HTTP
    status, not a 200 whose stream says so."""
    try:
        first = await anext(messages)
    except StopAsyncIteration:
        first = None

    async def events():
        version = first.weight_version if first is not None else ""
        try:
            if first is not None:
                yield "".join(await app.tokenizing.off_loop(builder.step, first))
            async for message in messages:
                version = message.weight_version or version
                yield "".join(await app.tokenizing.off_loop(builder.step, message))
            yield "".join(builder.end(version))
        except Exception as e:  # after the headers: an error event, as vLLM sends
            status, body, _ = error_body(e, route)
            yield sse_error(body)
        finally:
            with contextlib.suppress(Exception):
                await messages.aclose()

    headers = {VERSION_HEADER: first.weight_version if first is not None else ""}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


class Measured:
    """ASGI middleware: every request counted by route and status, and timed
    to its response's end (metrics.py)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = metrics.route_label(scope["path"])
        status = [500]
        began = time.perf_counter()

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            metrics.REQUESTS.labels(route, str(status[0])).inc()
            metrics.DURATION.labels(route).observe(time.perf_counter() - began)
