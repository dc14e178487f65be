"""The neutral floor shared by ``environments/`` and ``agentrl_jax/``.

Modules here import only the standard library and light third-party packages (aiohttp); never
JAX, never ``agentrl_jax`` and never ``environments``. Both of those packages may import from here.
docs/ARCHITECTURE.md lists the floors and what each may import.

``registry`` (the one registry mechanism), ``typed_sections`` (typed config sections),
``httpguard`` (the limits every HTTP server puts in front of its handlers), ``processes``
(starting, supervising and stopping server processes), ``seeding`` (``derive_seed``, pure Python).
"""
