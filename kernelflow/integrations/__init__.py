"""kernelflow inside other systems. For verl: ``kernelflow.integrations.verl`` is the
reward function its trainers call (``custom_reward_function``),
``kernelflow.integrations.verl_agent_loop`` the agent loop that makes kernelflow its
multi-turn rollout engine, ``kernelflow.integrations.verl_rollout`` the rollout ``agentic``
(``AgenticRollout`` in verl's rollout registry, loaded by verl as a plugin). None is
imported by the rest of kernelflow."""
