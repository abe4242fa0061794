"""A status's details as gRPC carries them: the `grpc-status-details-bin`
trailer that every language's status helpers read (the gRPC front's abort,
rpc/statuses.py, and its auth interceptor, ops/grpc_auth.py)."""

from __future__ import annotations

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import reason_name


def details_trailer(
    code,
    message: str,
    reason: pb.ErrorReason,
    violation=None,
    retry_after: float | None = None,
):
    """The `grpc-status-details-bin` trailer (grpcio-status packs it): a google.rpc.Status
    with an ErrorInfo (domain rollout.v1, the reason) and, for bad input, a
    BadRequest field violation; with `retry_after`, a RetryInfo. Clients in
    any language read these with their gRPC status-details helpers.
    `code`: a Code or a grpc.StatusCode."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    details = []
    if retry_after is not None:
        retry = any_pb2.Any()
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_after * 1e9))
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    if violation is not None:
        field, description = violation
        bad = any_pb2.Any()
        bad.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=field, description=description
                    )
                ]
            )
        )
        details.append(bad)
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason_name(reason), domain="rollout.v1"))
    details.append(info)
    # A grpc.StatusCode's value is a pair: (3, "invalid argument").
    number = code.value[0] if isinstance(code.value, tuple) else int(code)
    status = status_pb2.Status(code=number, message=message, details=details)
    return rpc_status.to_status(status).trailing_metadata
