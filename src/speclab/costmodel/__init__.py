"""Cost models: the study's linear step-time model, presets as TOML data files, and least-squares fitting."""

from speclab.costmodel.fit import fit_cost_model
from speclab.costmodel.model import DRAFT_FORMS, CostModel, DraftCost, TargetCost
from speclab.costmodel.registry import get_cost_model, list_cost_models

__all__ = [
    "DRAFT_FORMS",
    "CostModel",
    "DraftCost",
    "TargetCost",
    "fit_cost_model",
    "get_cost_model",
    "list_cost_models",
]
