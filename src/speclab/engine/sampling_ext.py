"""vLLM worker extensions: speclab's CPU sampling fix (`speclab.engine.cpu_sampling`), and with it the live
adaptive proposer over the engine's own model drafter (`speclab.live.vllm_eagle`).

vLLM imports the `worker_extension_cls` module in each worker right after the platform registers its own
kernel replacements, so importing this module there is the point at which the fix can take effect. Only the
engine worker imports it; speclab's other code uses `cpu_sampling` directly.
"""

from speclab.engine.cpu_sampling import install

INSTALLED = install()


class SamplingFixExtension:
    """No methods: vLLM mixes it into the worker class; its module's import did the work."""


class AdaptiveEagleExtension(SamplingFixExtension):
    """The sampling fix, and the live adaptive proposer over the engine's own model drafter
    (speclab.live.vllm_eagle), installed in each worker by `llm.collective_rpc("speclab_adaptive_install",
    args=(options,))`."""

    def speclab_adaptive_install(self, options: dict | None = None) -> str:
        from speclab.live.vllm_eagle import install

        install(self.model_runner, options)  # type: ignore[attr-defined]
        return "installed"

    def speclab_adaptive_counts(self) -> dict[str, int]:
        adapter = getattr(self.model_runner, "_speclab_adaptive", None)  # type: ignore[attr-defined]
        return adapter.counts() if adapter is not None else {}

    def speclab_adaptive_mode(self, mode: str) -> str:
        """Set the adapter's mode (speclab.live.vllm_eagle.AdaptiveEagle.set_mode); returns it as set."""
        adapter = getattr(self.model_runner, "_speclab_adaptive", None)  # type: ignore[attr-defined]
        if adapter is None:
            raise RuntimeError("speclab adaptive EAGLE: not installed (speclab_adaptive_install first)")
        return adapter.set_mode(mode)
