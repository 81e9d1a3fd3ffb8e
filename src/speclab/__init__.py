"""speclab: measure, trace, simulate and report speculative decoding on your own deployment."""

__version__ = "0.1.0"

# Trained-drafter presets resolve through the resolver speclab.drafters registers with speclab.models; loading
# it here registers it in every process that imports speclab (the CLI, the engine worker, a library caller).
from speclab import drafters as _drafters  # noqa: E402, F401
