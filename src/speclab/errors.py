"""Errors meant for the user: the CLI prints them as one clear line, without a traceback."""


class SpeclabError(Exception):
    """Base class for errors caused by bad input or environment, not by a bug in speclab."""


class TraceError(SpeclabError):
    """A trace file or record is malformed."""


class ConfigError(SpeclabError):
    """A sweep file, preset, policy or option is invalid."""
