"""The App's old import path, kept while server.py still imports it from
here: the App lives in pipeline/serving.py."""

from rollout_service.pipeline.serving import App

__all__ = ["App"]
