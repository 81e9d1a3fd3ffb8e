"""Drafters trained by speclab on the machine at hand, self-distilled from the target: EAGLE-3 heads
(`speclab drafters train eagle`, speclab.drafters.train) and small draft models distilled from the target's
logits (`speclab drafters train draft`, speclab.drafters.distill); both by preset name, trained on first use
(speclab.drafters.named, registered here as speclab.models' resolver of trained presets). torch and
transformers are imported by the submodules only.
"""

from speclab.drafters import named
from speclab.models.trained import register_trained_resolver

register_trained_resolver(named)
