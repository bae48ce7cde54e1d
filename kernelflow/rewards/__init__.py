"""Rewards at RL scale: a trainer asks the daemons' verifier pool over NATS (or HTTP, with
``kernelflow serve-rewards``) and awaits the verdict, recorded in the log like every
verification (docs/verl.md, "Rewards from the verifier pool")."""

from kernelflow.rewards.client import (
    NoVerifierPool,
    RewardClient,
    RewardTimeout,
    close_shared_clients,
    shared_client,
)
from kernelflow.rewards.request import RewardAnswer, RewardRequest, RewardUnjudged

__all__ = [
    "NoVerifierPool",
    "RewardAnswer",
    "RewardClient",
    "RewardRequest",
    "RewardTimeout",
    "RewardUnjudged",
    "close_shared_clients",
    "shared_client",
]
