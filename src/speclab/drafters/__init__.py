"""Drafters trained by speclab on the machine at hand: EAGLE-3 heads self-distilled from the target.

`speclab drafters train eagle --target smollm2-135m` (see speclab.drafters.train). torch and transformers are
imported by the submodules only.
"""
