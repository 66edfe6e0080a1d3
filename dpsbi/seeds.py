"""Seeds as dpsbi takes them: integers from 0 to 2**63 - 1 (numpy's ``SeedSequence`` refuses negative ones,
torch wraps them), checked before any compute."""

from __future__ import annotations

import numbers

#: The largest seed accepted (the seeds dpsbi derives are 63-bit).
MAX_SEED = 2**63 - 1


def check_seed(seed, what: str = "seed") -> int:
    """``seed`` as an ``int``, or a ``ValueError`` naming ``what`` when it is not an integer in ``[0, MAX_SEED]``
    (a bool, a float, a string or a negative number)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{what} must be an integer from 0 to 2**63 - 1, got {seed!r}; pass e.g. {what}=0")
    return int(seed)
