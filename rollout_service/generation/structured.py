"""SamplingParams.structured_output to vLLM's StructuredOutputsParams.

The constraint's own syntax (a schema that is not JSON, nests too deep or
holds NaN; a regex that does not compile or nests too deep for Python's
recursive regex parser) is checked here, so that it is refused with a named
field before the engine sees it; whether the backend supports every feature
of it is vLLM's check, mapped to INVALID_ARGUMENT by the error policy.
"""

from __future__ import annotations

import re

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation import json_input
from rollout_service.status.errors import InvalidArgument

FIELD = "sampling_params.structured_output"


def structured_outputs_from_proto(so: pb.StructuredOutput):
    """The vLLM StructuredOutputsParams for `so`, or None when unset."""
    from vllm.sampling_params import StructuredOutputsParams

    kind = so.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "json_schema":
        schema = json_input.load_object(so.json_schema, f"{FIELD}.json_schema", "a JSON schema")
        return StructuredOutputsParams(json=schema)
    if kind == "regex":
        try:
            re.compile(so.regex)
        except re.error as e:
            raise InvalidArgument(f"{FIELD}.regex", f"does not compile ({e})") from e
        except RecursionError as e:  # "(" * 500 already
            raise InvalidArgument(f"{FIELD}.regex", "nests groups too deep to compile") from e
        if not so.regex:
            raise InvalidArgument(f"{FIELD}.regex", "must not be empty")
        return StructuredOutputsParams(regex=so.regex)
    if kind == "choice":
        choices = list(so.choice.choices)
        if not choices:
            raise InvalidArgument(f"{FIELD}.choice.choices", "must list at least one choice")
        for i, c in enumerate(choices):
            if not c:
                raise InvalidArgument(f"{FIELD}.choice.choices[{i}]", "must not be empty")
        return StructuredOutputsParams(choice=choices)
    if kind == "grammar":
        if not so.grammar.strip():
            raise InvalidArgument(f"{FIELD}.grammar", "must not be empty")
        return StructuredOutputsParams(grammar=so.grammar)
    if not so.json_object:
        raise InvalidArgument(f"{FIELD}.json_object", "set it to true, or set no constraint")
    return StructuredOutputsParams(json_object=True)
