"""Shared test set-up: the simulator tests' hand-checkable online policies (tests/sim_policies.py)."""

from sim_policies import register

register()
