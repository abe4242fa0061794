"""What the HTTP front logs of its own refusals (401, 404, 413, 429...): a
caller's mistake at INFO as the gRPC front logs a refusal, never at ERROR
("failed"), which is an operator's alert and which any caller could fill."""

from __future__ import annotations

import logging

import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http.errors import HttpError, error_body


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (401, "UNAUTHENTICATED"),
        (404, "NOT_FOUND"),
        (405, "UNIMPLEMENTED"),
        (413, "RESOURCE_EXHAUSTED"),
        (499, "CANCELLED"),
        (418, "INVALID_ARGUMENT"),
    ],
)
def test_a_refusal_of_the_front_is_logged_at_info_with_its_status(caplog, status, code):
    caplog.set_level(logging.INFO)
    error = HttpError(status, "unknown token", reason=pb.ERROR_REASON_AUTH_REQUIRED)
    answered, body, _ = error_body(error, "/v1/models")
    assert answered == status
    assert body["error"]["message"] == "unknown token"
    [record] = [r for r in caplog.records if "/v1/models" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == f"/v1/models refused: {code} unknown token"


def test_a_server_error_of_the_front_is_logged_at_error(caplog):
    caplog.set_level(logging.INFO)
    error_body(HttpError(500, "broken"), "/v1/models")
    [record] = [r for r in caplog.records if "/v1/models" in r.getMessage()]
    assert record.levelno == logging.ERROR
