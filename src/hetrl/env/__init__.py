"""Environments: tasks become episodes the policy acts in, token-in-token-out.

Public surface: ``Environment``/``Task``/``StepResult`` (base), ``run_episode`` (runner),
``ChatCodec`` (chat template deltas), ``ToolRegistry``/``parse_tool_calls`` (tools), ``EpisodeRunner``
(concurrent episodes, the rollout role's driver), and the allowlisted builders ``build_env``/``env_factory``/
``build_task_stream`` (registry). Submodules import lazily: importing ``hetrl.env`` pulls in no
sandbox, reasoning-gym or PIL.
"""
