"""kernelflow inside other systems. For verl: ``kernelflow.integrations.verl`` is the
reward function its trainers call (``custom_reward_function``),
``kernelflow.integrations.verl_agent_loop`` the agent loop that makes kernelflow its
multi-turn rollout engine. Neither is imported by the rest of kernelflow."""
