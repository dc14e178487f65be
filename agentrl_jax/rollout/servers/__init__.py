"""The SGLang-compatible HTTP inference server around an embedded engine (run as ``python -m
agentrl_jax.rollout.servers.server``; the application in ``app.py``, the handlers in
``routes.py`` / ``openai_routes.py``, what they share in ``protocol.py``), its request models (``api_models.py``)
and the chat-template sandbox process (``chat_template_sandbox.py``)."""
