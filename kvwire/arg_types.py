"""argparse types for counts, rates and ports on the command lines (the engine's, the load
tools'): a value no run can use is refused at parse time, naming the flag, instead of
failing later with a traceback."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0: none of it, where the flag says so)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = float(text)
    if not 0 < value < math.inf:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def port(text: str) -> int:
    """A TCP port, 1-65535."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1-65535, got {value}")
    return value


def float_between(low: float, high: float, unit: str = "", *,
                  open_low: bool = False) -> Callable[[str], float]:
    """A type for a finite number in [``low``, ``high``], or (``low``, ``high``] with
    ``open_low``; ``unit`` follows the bounds in the message (``" seconds"``)."""
    bounds = f"> {low:g} and <= {high:g}{unit}" if open_low else \
        f"between {low:g} and {high:g}{unit}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (low < value if open_low else low <= value) or not value <= high:  # NaN too
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    parse.__name__ = f"number {bounds}"
    return parse


def slowdowns(text: str) -> tuple[float, ...]:
    """Comma-separated device slowdowns, one per replica from r0 (``1,1,3``: r2's device
    three times slower), each in (0, 100]."""
    try:
        factors = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers (1,1,3), got {text!r}") from None
    for factor in factors:
        if not 0 < factor <= 100:  # NaN too
            raise argparse.ArgumentTypeError(f"each factor must be in (0, 100], got {text!r}")
    return factors
