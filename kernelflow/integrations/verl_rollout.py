"""kernelflow's ``AgenticRollout`` as verl's rollout ``agentic`` (docs/agents.md,
"generate_sequences and verl").

Importing this module registers ``("agentic", "async")`` in verl's rollout registry (verl
0.9: ``verl.workers.rollout.base``), so that ``get_rollout_class("agentic")`` gives
``AgenticVerlRollout`` and ``actor_rollout_ref.rollout.name=agentic`` selects it. kernelflow's
``verl.plugins`` entry point (``pyproject.toml``) imports it wherever verl is imported, so
no setting of verl's is needed for that.

The rollout's settings are its ``rollout`` section, read by
``AgenticRolloutConfig.from_dict`` (verl's own keys it does not use are ignored, with one
warning); the agentic rollout's own keys go at the section's top (as the AgenticRollout
document writes them) or, where verl's ``RolloutConfig`` must stay as verl declares it, under
``engine_kwargs.agentic`` (verl's place for one rollout engine's settings).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

# verl (and its torch) are not kernelflow dependencies: type-checked where installed.
from verl.workers.rollout import base  # type: ignore[import-not-found,unused-ignore]

from kernelflow.agentic_rollout.config import ROLLOUT_NAME

base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.AgenticVerlRollout"


class AgenticVerlRollout(base.BaseRollout):  # type: ignore[misc,unused-ignore]
    """verl's rollout interface over an ``AgenticRollout``: ``generate_sequences`` runs the
    agent on each row. Its model is the provider its config names (``llm``: an
    OpenAI-compatible server, say), which verl's trainer does not update: to train a
    policy that verl's own servers serve, use the agent loop (docs/verl.md, "Agent
    loop")."""

    def __init__(
        self,
        config: Any,
        model_config: Any,
        device_mesh: Any,
        *args: Any,
        llm_generate_func: Any = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        from kernelflow.agentic_rollout import AgenticRollout, AgenticRolloutConfig

        if tokenizer is None and self.model_config is not None:
            tokenizer = getattr(self.model_config, "tokenizer", None)
        self.rollout = AgenticRollout(
            AgenticRolloutConfig.from_dict(self.config),
            llm_generate_func=llm_generate_func,
            tokenizer=tokenizer,
            **kwargs,
        )

    def generate_sequences(self, prompts: Any) -> Any:
        """verl's synchronous call: the rows' trajectories as a ``DataProto``
        (``AgenticRollout.generate_sequences``); from a coroutine, await
        ``self.rollout.generate_sequences`` instead."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.rollout.generate_sequences(prompts))
        raise RuntimeError(
            "AgenticVerlRollout.generate_sequences is synchronous: within an event loop, "
            "await its rollout.generate_sequences(prompts)"
        )

    async def resume(self, tags: list[str]) -> None:
        """Nothing of the agentic rollout's is held on the device (its model is served
        elsewhere): there is nothing to bring back."""

    async def release(self) -> None:
        """Nothing of the agentic rollout's is held on the device: nothing to free."""

    async def update_weights(
        self,
        weights: Generator[tuple[str, Any], None, None],
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        raise NotImplementedError(
            "rollout 'agentic' runs its agent on the model its config names (llm), which "
            "verl does not update; to train the policy verl serves, use kernelflow's agent "
            "loop (docs/verl.md, 'Agent loop')"
        )
