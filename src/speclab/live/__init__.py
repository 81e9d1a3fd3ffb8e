"""The adaptive policies live inside vLLM: `driver.AdaptiveDriver` (the per-step bookkeeping around a
speclab.policy object), `vllm_custom.SpeclabAdaptiveProposer` (the custom_class proposer users name in a
speculative config) and `play.play_engine` (vLLM's batching played offline, for tests). Guide:
docs/adaptive.md."""
