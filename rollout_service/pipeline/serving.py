"""What one running engine is served with: every object built for it,
handed over at once. The wiring that builds it is `app.py`'s; this is its
shape, which the pipeline and every front depend on (so they import nothing
above them)."""

from __future__ import annotations

from dataclasses import dataclass

from rollout_service.engine.gate import AdmissionGate
from rollout_service.engine.protocol import Engine
from rollout_service.engine.served import Served
from rollout_service.engine.startup import EngineInfo
from rollout_service.fairness.share import FairShare
from rollout_service.generation.tokenizing import Tokenizing
from rollout_service.sessions.store import SessionStore
from rollout_service.update.lora import Adapters
from rollout_service.update.sleep import Sleeper
from rollout_service.update.transfers import WeightTransfers
from rollout_service.update.updates import WeightUpdater


@dataclass
class App:
    """What the pipeline (generations.py) and the fronts serve with."""

    engine: Engine
    info: EngineInfo
    served: Served
    gate: AdmissionGate
    updater: WeightUpdater
    transfers: WeightTransfers
    tokenizing: Tokenizing
    adapters: Adapters
    sleeper: Sleeper
    session_store: SessionStore
    fair: FairShare

    def close(self) -> None:
        """After the engine has shut down (its workers read the staging
        region and load adapters from the adapters' folder until then)."""
        self.updater.close()
        self.adapters.close()
