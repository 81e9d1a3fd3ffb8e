"""Offline stand-ins for the study's datasets, built at run time from material already on the machine.

Each module registers one workload. They never touch the network and import nothing heavy.
"""
