"""vLLM worker extension that installs speclab's CPU sampling fix (`speclab.engine.cpu_sampling`).

vLLM imports the `worker_extension_cls` module in each worker right after the platform registers its own
kernel replacements, so importing this module there is the point at which the fix can take effect. Only the
engine worker imports it; speclab's other code uses `cpu_sampling` directly.
"""

from speclab.engine.cpu_sampling import install

INSTALLED = install()


class SamplingFixExtension:
    """No methods: vLLM mixes it into the worker class; its module's import did the work."""
