"""Test-session set-up shared by every test module.

8 virtual CPU devices so sharded code paths (data / fsdp / tensor meshes) run in the ordinary
suite; computations that are not sharded still run on device 0. Must happen before JAX starts.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
