"""The routes (docs/openai.md): each one authorizes its caller, reads its
body within bounds, hands what grows with the request to the tokenizing
thread, and runs its generation through the pipeline, as a gRPC handler
does. Errors are OpenAI's JSON error body (errors.py), also for paths that
do not exist."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import batch, metrics
from rollout_service.http.body import read_bounded
from rollout_service.http.callers import authorize
from rollout_service.http.chat import prepare_chat
from rollout_service.http.completions import (
    completion_response,
    one_version,
    prepare_completion,
)
from rollout_service.http.errors import HttpError, error_body, error_response
from rollout_service.http.front import Front
from rollout_service.http.replies import VERSION_HEADER, streamed, until_disconnected
from rollout_service.http.responses import chat_response
from rollout_service.http.session_routes import add_session_routes
from rollout_service.http.streaming import ChatStream, CompletionStream
from rollout_service.ops.logs import request_id as logged_request_id


def build_api(front: Front) -> Measured:
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
        return await _chat(front, request)

    @api.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(front, request)

    add_session_routes(api, front)
    return Measured(api)


async def _prepared(front: Front, request: Request, prepare):
    """The caller, the pipeline and the request parsed by `prepare` (on the
    tokenizing thread)."""
    who = authorize(front.tokens, request)
    ready = front.ready()
    raw = await read_bounded(request)
    call = await ready.app.tokenizing.off_loop(prepare, raw, front, ready.app)
    return who, ready, call


async def _chat(front: Front, request: Request):
    route = "/v1/chat/completions"
    try:
        who, ready, call = await _prepared(front, request, prepare_chat)
        app = ready.app
        logged_request_id.set(call.generate.request_id)
        model = call.request.model or app.info.model
        if call.request.stream:
            stream = await app.tokenizing.off_loop(_stream_request, call.generate)
            messages = ready.generations.stream(stream, who)
            builder = ChatStream(call, model, app, call.generate.request_id)
            return await streamed(messages, builder, app, route)
        answer = await until_disconnected(request, ready.generations.generate(call.generate, who))
        body = await app.tokenizing.off_loop(
            lambda: chat_response(call, answer, model, app).model_dump_json()
        )
        return Response(
            body, media_type="application/json", headers={VERSION_HEADER: answer.weight_version}
        )
    except Exception as e:
        return error_response(e, route, "messages")


async def _complete(front: Front, request: Request):
    """A completion: each prompt a generation of its own (batch.py)."""
    route = "/v1/completions"
    try:
        who, ready, call = await _prepared(front, request, prepare_completion)
        app, generations = ready.app, ready.generations
        logged_request_id.set(call.request_id)
        batch.check_room(app.fair, who, len(call.generates))
        model = call.request.model or app.info.model
        if call.request.stream:
            requests = await app.tokenizing.off_loop(
                lambda: [_stream_request(g) for g in call.generates]
            )
            messages = batch.stream(generations, requests, who, call.request.n)
            builder = CompletionStream(call, model, app, call.request_id)
            return await streamed(messages, builder, app, route)
        run = batch.generate(generations, call.generates, who)
        answers = await until_disconnected(request, run)
        body = await app.tokenizing.off_loop(
            lambda: completion_response(call, answers, model, app).model_dump_json()
        )
        version = one_version(a.weight_version for a in answers)
        return Response(body, media_type="application/json", headers={VERSION_HEADER: version})
    except Exception as e:
        return error_response(e, route, "prompt")


def _stream_request(request: pb.GenerateRequest) -> pb.GenerateStreamRequest:
    """The same request for GenerateStream (the proto keeps their fields'
    numbers equal; the copy grows with the prompt: off the loop)."""
    return pb.GenerateStreamRequest.FromString(request.SerializeToString())


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
