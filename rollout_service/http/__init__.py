"""The OpenAI-compatible HTTP front (docs/openai.md): FastAPI routes served by
uvicorn on the gRPC server's event loop, every generation through the same
pipeline (pipeline/generations.py) as a gRPC Generate. vLLM's own OpenAI
protocol models parse requests and build responses, its chat rendering and
tool parsers do what they do in `vllm serve`; this package only maps them to
and from rollout.v1 messages. Nothing here imports gRPC."""
