"""Sessions as OpenAI base URLs (docs/openai.md, "Sessions as base URLs").

POST /sessions opens a session as OpenSession does (sessions/open_call.py)
and answers its base URL, `<this server>/sessions/{id}/v1`. A chat
completion there is a turn of that session: its messages must extend the
conversation the session holds (session_history.py); what is new is
appended by the session's template rule, then the turn runs through the
pipeline's session turns (SessionTurns: the caller's slot, the session's one
call at a time, the gate, the engine) with the request's sampling, and the
answer is built as /v1/chat/completions builds it (responses.py,
streaming.py). The session is found as every session RPC finds it
(`SessionTurns.find`): an id not open here is 404, another token's session
403. The trainer reads the trajectory with GetSession.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import session_chat
from rollout_service.http.body import read_bounded
from rollout_service.http.callers import authorize
from rollout_service.http.errors import error_response
from rollout_service.http.front import Front
from rollout_service.http.replies import VERSION_HEADER, streamed, until_disconnected
from rollout_service.http.responses import chat_response
from rollout_service.http.session_opening import open_request, opened
from rollout_service.http.streaming import ChatStream
from rollout_service.ops.auth import CALLER, ROLE_OF
from rollout_service.ops.logs import request_id as logged_request_id
from rollout_service.sessions.open_call import open_session

CHAT_ROUTE = "/sessions/{session_id}/v1/chat/completions"
OPEN = ROLE_OF.get("OpenSession", "generate")
TURN = ROLE_OF.get("SessionGenerate", "generate")


def add_session_routes(api: FastAPI, front: Front) -> None:
    """POST /sessions, and each session's /v1/chat/completions and /v1/models."""

    @api.post("/sessions")
    async def open_(request: Request):
        try:
            authorize(front.tokens, request, OPEN)
            ready = front.ready()
            raw = await read_bounded(request)
            app = ready.app
            body = await app.tokenizing.off_loop(open_request, raw, front, app)
            session_id = ready.turns.ids.issue()
            session, response = await open_session(app, session_id, CALLER.get().owner, body)
            response.base_url = f"{str(request.base_url).rstrip('/')}/sessions/{session.id}/v1"
            return JSONResponse(opened(response, session))
        except Exception as e:
            return error_response(e, "/sessions")

    @api.get("/sessions/{session_id}/v1/models")
    async def models(request: Request, session_id: str):
        try:
            authorize(front.tokens, request, TURN)
            ready = front.ready()
            session = ready.turns.find(session_id)
            app = ready.app
        except Exception as e:
            return error_response(e, "/sessions/{session_id}/v1/models")
        from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList

        name = session.lora_adapter or app.info.model
        card = ModelCard(id=name, root=name, max_model_len=session.budget)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @api.post(CHAT_ROUTE)
    async def chat(request: Request, session_id: str):
        return await _turn(front, request, session_id)


async def _turn(front: Front, request: Request, session_id: str):
    try:
        who = authorize(front.tokens, request, TURN)
        ready = front.ready()
        app = ready.app
        raw = await read_bounded(request)
        session = ready.turns.find(session_id)
        tok = app.tokenizing
        chat = await tok.off_loop(session_chat.prepare, raw, front, app, session)
        logged_request_id.set(chat.call.generate.request_id)
        with app.session_store.using(session):
            limits = app.info.limits
            await tok.off_loop(session_chat.extend_session, session, chat.messages, limits, tok)
        partial = session_chat.interrupted(session)
        turn = chat.turn()
        turn.session_id = session.id
        model = chat.call.request.model or session.lora_adapter or app.info.model
        if chat.call.request.stream:
            stream = pb.SessionGenerateStreamRequest(
                session_id=turn.session_id,
                request_id=turn.request_id,
                sampling_params=turn.sampling_params,
                required_weight_version=turn.required_weight_version,
                stream_options=pb.StreamOptions(),
            )
            steps = ready.turns.run(stream, stream.stream_options, who)
            builder = ChatStream(chat.call, model, app, turn.request_id or "session")
            deltas = _deltas(steps, chat, session, partial, app)
            return await streamed(deltas, builder, app, CHAT_ROUTE)
        answer = await until_disconnected(request, ready.turns.generate(turn, who))

        def build() -> tuple[str, session_chat.Message]:
            response = session_chat.whole_turn(chat, answer, partial, session, app)
            [c] = response.completions
            entry = session_chat.held_message(chat, c.text, list(c.token_ids), app)
            return chat_response(chat.call, response, model, app).model_dump_json(), entry

        body, entry = await tok.off_loop(build)
        session_chat.record(session, entry, partial is not None)
        return Response(
            body, media_type="application/json", headers={VERSION_HEADER: answer.weight_version}
        )
    except Exception as e:
        return error_response(e, CHAT_ROUTE)


async def _deltas(
    steps, chat: session_chat.SessionChat, session, partial, app
) -> AsyncIterator[pb.GenerateStreamResponse]:
    """A turn's deltas as GenerateStream's (the last with its finish reason
    and usage, as SessionGenerateStream sends them), a resumed turn's earlier
    tokens first; once it ends, the message it made is held. A stream closed
    before its end (the client went away) holds none: closing it aborts the
    turn, whose tokens the session keeps, interrupted."""
    texts: list[str] = []
    ids: list[int] = []
    first = True
    try:
        async for step in steps:
            d = step.delta
            if first:
                first = False
                plan_ids = step.turn.plan.prompt_ids
                before = len(partial.ids) if partial is not None else 0
                chat.call.prompt_ids = plan_ids[: len(plan_ids) - before]
                if partial is not None and partial.ids:
                    text = await app.tokenizing.off_loop(app.tokenizing.decode, partial.ids, True)
                    earlier = pb.GenerateStreamResponse(
                        request_id=d.request_id,
                        token_ids=partial.ids,
                        logprobs=partial.logprobs,
                        text=text,
                        weight_version=d.weight_version,
                    )
                    texts.append(text)
                    ids.extend(partial.ids)
                    yield earlier
            if step.state is not None:
                d.finish_reason = session_chat.finish_reason(step.turn.finish_reason())
                d.usage.CopyFrom(step.turn.usage())
            texts.append(d.text)
            ids.extend(d.token_ids)
            yield d
    finally:
        with contextlib.suppress(Exception):
            await steps.aclose()
    entry = await app.tokenizing.off_loop(session_chat.held_message, chat, "".join(texts), ids, app)
    session_chat.record(session, entry, partial is not None)
