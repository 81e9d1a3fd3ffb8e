"""One layer of checks for numbers and shapes that come from a file or an option, used before any work.

- numbers: `integer` and `number` accept only what they say (no bool, no string), refuse NaN, infinities
  and integers too large for a float (hundreds of digits), and check a closed range;
- JSON and TOML: `loads_json` and `loads_toml` turn every parser failure (malformed text, a number with
  thousands of digits, nesting deeper than the parser can follow) into one line naming the source, and
  refuse documents nested deeper than MAX_DEPTH or larger than MAX_TEXT_BYTES;
- keys: `unknown_keys` names the keys a table may not have, with the nearest known name for a typo;
  `unknown_fields` lists every field a sweep table may not have, with all the known ones.

Every check raises the error class it is given (ConfigError by default), so a trace, a workload and a sweep
each keep their own kind of error.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Callable, Iterable
from typing import Any

from speclab.errors import ConfigError, SpeclabError

# the largest batch size any command accepts: far beyond any engine, small enough for every array type
MAX_BATCH_SIZE = 1 << 20
# the most prompts a workload option or a sweep asks for, and the seeds every command accepts
MAX_PROMPTS = 1 << 20
MAX_SEED = (1 << 32) - 1
# far deeper than any real sweep, cost model, prompt or trace record; far below what a parser can follow
MAX_DEPTH = 64
MAX_TEXT_BYTES = 1 << 30


def integer(
    v: Any, where: str, lo: int | None = None, hi: int | None = None, error: type[SpeclabError] = ConfigError
) -> int:
    """`v` as an int in lo..hi (bounds optional); refuses bools, floats and other types."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise error(f"{where}: expected an integer, got {show(v)}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise error(f"{where}: {show(v)} out of range {_range(lo, hi)}")
    return v


def number(
    v: Any,
    where: str,
    lo: float | None = None,
    hi: float | None = None,
    error: type[SpeclabError] = ConfigError,
) -> float:
    """`v` as a finite float in lo..hi (bounds optional); an int too large for a float is refused."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise error(f"{where}: expected a number, got {show(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise error(f"{where}: {show(v)} is too large") from None
    if not math.isfinite(f):
        raise error(f"{where}: expected a finite number, got {v!r}")
    if (lo is not None and f < lo) or (hi is not None and f > hi):
        raise error(f"{where}: {show(v)} out of range {_range(lo, hi)}")
    return f


def _range(lo: float | None, hi: float | None) -> str:
    if hi is None:
        return f">= {lo:g}" if isinstance(lo, float) else f">= {lo}"
    if lo is None:
        return f"<= {hi:g}" if isinstance(hi, float) else f"<= {hi}"
    return f"{lo:g}..{hi:g}" if isinstance(lo, float) or isinstance(hi, float) else f"{lo}..{hi}"


def show(v: Any) -> str:
    """A value for a message: a huge integer by its size, not its hundreds of digits."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**30:
        return f"an integer of {len(str(abs(v))) if abs(v) < 10**4000 else 'thousands of'} digits"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list | tuple):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in v if type(x) in (list, dict, tuple))
    return deepest


def check_depth(value: Any, where: str, error: type[SpeclabError] = ConfigError) -> Any:
    if depth(value) > MAX_DEPTH:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep")
    return value


def _parse(
    text: str | bytes,
    where: str,
    error: type[SpeclabError],
    kind: str,
    parse: Callable[[Any], Any],
    syntax_error: type[ValueError],
    describe: Callable[[Any], str],
) -> Any:
    """parse(text) with every failure as one line naming `where`: too large, a syntax error (`describe`d),
    too deep, or a value Python refuses (an integer of more than 4300 digits); then the depth check."""
    if len(text) > MAX_TEXT_BYTES:
        raise error(f"{where}: larger than {MAX_TEXT_BYTES >> 20} MiB")
    try:
        value = parse(text)
    except syntax_error as exc:
        raise error(f"{where}: {describe(exc)}") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise error(f"{where}: not usable {kind} ({exc})") from None
    return check_depth(value, where, error)


def loads_json(text: str | bytes, where: str, error: type[SpeclabError] = ConfigError) -> Any:
    """json.loads with every failure as one line naming `where` (and the line and column)."""
    return _parse(
        text, where, error, "JSON", json.loads, json.JSONDecodeError,
        lambda e: f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})",
    )  # fmt: skip


def loads_toml(text: str, where: str, error: type[SpeclabError] = ConfigError) -> dict[str, Any]:
    """tomllib.loads with every failure as one line naming `where` (the message ends with its line, column)."""
    return _parse(
        text, where, error, "TOML", tomllib.loads, tomllib.TOMLDecodeError, lambda e: f"malformed TOML: {e}"
    )


def is_finite_number(v: Any) -> bool:
    """An int or float (not a bool) that is finite as a float (an int too large for a float is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def check_numbers(
    value: Any, where: str, max_abs: float = float(1 << 53), error: type[SpeclabError] = ConfigError
) -> Any:
    """Refuse any NaN, infinity or number beyond +-max_abs anywhere in a parsed document, naming its field
    (for documents whose every number is a size, a count or a time)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
        elif (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and not (is_finite_number(v) and abs(v) <= max_abs)
        ):
            if is_finite_number(v):
                raise error(f"{where}: field {path}: {show(v)} out of range (at most {max_abs:g} in size)")
            raise error(f"{where}: field {path}: expected a number, got {show(v)}")
    return value


def near_miss(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest known name, else ''."""
    match = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.75)
    return f" (did you mean {match[0]}?)" if match else ""


def unknown_keys(
    keys: Iterable[object],
    known: Iterable[str],
    where: str,
    error: type[SpeclabError] = ConfigError,
    list_known: bool = True,
) -> None:
    """Refuse keys not in `known`: the first is named with the nearest known name."""
    known = sorted(known)
    bad = sorted(str(k) for k in keys if k not in known)
    if not bad:
        return
    also = f" (and {', '.join(bad[1:])})" if len(bad) > 1 else ""
    listing = f"; known: {', '.join(known)}" if list_known else ""
    raise error(f"{where}: unknown key {bad[0]!r}{near_miss(bad[0], known)}{also}{listing}")


def unknown_fields(
    keys: Iterable[str], known: Iterable[str], where: str, error: type[SpeclabError] = ConfigError
) -> None:
    """Refuse the keys of a sweep table not in `known`: '<where>: unknown field(s): a, b (known: ...)', the
    unknown ones sorted, the known ones in the order given."""
    known = list(known)
    bad = sorted(set(keys) - set(known))
    if bad:
        raise error(f"{where}: unknown field(s): {', '.join(bad)} (known: {', '.join(known)})")
