"""The SGLang-compatible HTTP inference server around an embedded engine (``server.py``, run
as ``python -m agentrl_jax.rollout.servers.server``), its request models (``api_models.py``)
and the chat-template sandbox process (``chat_template_sandbox.py``)."""
