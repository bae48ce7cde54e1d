"""``AgenticRolloutConfig``: the settings of an ``AgenticRollout`` (docs/agents.md,
"AgenticRollout"), from Python, a mapping (the ``rollout`` section of a verl config) or
the environment.

Environment variables give the defaults of the settings they name (a value passed
explicitly wins): ``AGENTIC_MAX_CONCURRENT_REQUESTS`` (``concurrent_requests``),
``AGENTIC_SAVE_TRAJECTORIES`` (``save_trajectories``: true/false), ``AGENTIC_DEFAULT_TIMEOUT``
(seconds a tool call may take) and ``AGENTIC_LOG_LEVEL`` (the level of the
``kernelflow.agentic_rollout`` logger). The model's keys are the providers' own
(``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``: docs/llm.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The environment is read as kernelflow's own settings read it.
from kernelflow.host.settings import _env_bool, _env_int, _env_seconds

DEFAULT_TOOL_TIMEOUT_S = 30.0
LOGGER = "kernelflow.agentic_rollout"


def default_tool_timeout() -> float:
    """Seconds a tool call may take: ``AGENTIC_DEFAULT_TIMEOUT``, else 30."""
    return _env_seconds("AGENTIC_DEFAULT_TIMEOUT", DEFAULT_TOOL_TIMEOUT_S)


def apply_log_level() -> None:
    """Set the library's logger to ``AGENTIC_LOG_LEVEL``, where it is set."""
    raw = os.environ.get("AGENTIC_LOG_LEVEL")
    if raw:
        level = logging.getLevelName(raw.strip().upper())
        if not isinstance(level, int):
            raise ValueError(f"AGENTIC_LOG_LEVEL: {raw!r} is not a log level (DEBUG, INFO...)")
        logging.getLogger(LOGGER).setLevel(level)


@dataclass
class AgenticRolloutConfig:
    # The agent: its registered name (react, tool, coding, or one of register_agent's).
    agent_type: str = "react"
    max_steps: int = 10
    max_tokens_per_step: int = 512
    temperature: float = 0.7
    # Tools and interactions, as verl configures them (tools_from_config).
    tools_config: dict[str, Any] | None = None
    interactions_config: dict[str, Any] | None = None
    batch_size: int = 1
    concurrent_requests: int = field(
        default_factory=lambda: _env_int("AGENTIC_MAX_CONCURRENT_REQUESTS", 4)
    )
    include_trajectory_in_output: bool = True
    save_trajectories: bool = field(default_factory=lambda: _env_bool("AGENTIC_SAVE_TRAJECTORIES"))
    trajectory_save_path: str | None = None
    # kernelflow's: the model as a provider spec (docs/llm.md: anthropic:MODEL,
    # openai:URL#MODEL, scripted:FILE...) when no llm_generate_func is given; None: the
    # configured default.
    llm: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens_per_step", "batch_size", "concurrent_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgenticRolloutConfig.{name}: must be at least 1")
        if self.interactions_config:
            raise ValueError(
                "AgenticRolloutConfig.interactions_config: not supported (kernelflow's agents "
                "talk to their model and their tools only)"
            )

    @classmethod
    def from_dict(cls, data: Any) -> AgenticRolloutConfig:
        """The config of verl's: a whole config (``actor_rollout_ref.rollout``) or its
        ``rollout`` section, as a mapping or verl's ``RolloutConfig``. The section's keys
        that are settings here are taken, and those under ``engine_kwargs.agentic`` (unknown
        ones refused there); verl's others (``n``, ``prompt_length``...) are ignored, with
        one warning naming them."""
        whole = _mapping(data)
        section = _mapping(_mapping(whole.get("actor_rollout_ref")).get("rollout") or whole)
        known = {f.name for f in dataclasses.fields(cls)}
        given = {str(k): v for k, v in section.items() if str(k) in known}
        ignored = sorted(str(k) for k in section if str(k) not in known | _VERL_META)
        own = _mapping(_mapping(section.get("engine_kwargs")).get(ROLLOUT_NAME))
        unknown = sorted(str(k) for k in own if str(k) not in known)
        if unknown:
            raise ValueError(
                f"rollout.engine_kwargs.{ROLLOUT_NAME}.{unknown[0]}: unknown setting; "
                f"known: {', '.join(sorted(known))}"
            )
        given.update({str(k): v for k, v in own.items()})
        if ignored:
            logging.getLogger(LOGGER).warning(
                "rollout: %d of verl's settings are not the agentic rollout's and are ignored: %s",
                len(ignored),
                ", ".join(ignored),
            )
        return cls(**given)


# verl's keys that say what the section is, not how to run it.
_VERL_META = frozenset({"name", "_target_", "engine_kwargs"})
# The rollout's name in verl (``actor_rollout_ref.rollout.name``).
ROLLOUT_NAME = "agentic"


def _mapping(value: Any) -> Mapping[str, Any]:
    """A config node as a mapping: a mapping as it is (omegaconf's too), a dataclass
    (verl's ``RolloutConfig``) as its fields, nothing as empty."""
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return {}
