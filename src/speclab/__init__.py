"""speclab: measure, trace, simulate and report speculative decoding on your own deployment."""

__version__ = "0.1.0"
