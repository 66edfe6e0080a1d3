"""Which ways of copying a mechanism with a tensor epsilon torch.compile traces whole (fullgraph, eager backend),
on the torch at hand: torch 2.11 refused ``batched_copy``'s ``{**vars(mechanism), ...}`` ("isinstance() cannot
determine type of argument GetAttrVariable(..., __dict__)", the epsilon-conditioned step's trace failure), 2.13
traces it. One line per variant, ``traced`` or the error's first line; seconds on a CPU.

    python scripts/archive/dynamo_copy_probe.py

Answered (eleventh session, torch 2.11.0 installed on a CPU machine): 2.11 traces none of the five, nor any other
way of reading an instance's attribute names (``list``, ``dict``, ``copy`` or ``**`` of ``__dict__``,
``__getstate__``); it traces reading attributes by name. dpsbi needs torch >= 2.13, whose compiler traces all
five, so ``batched_copy`` stays, and the epsilon-conditioned trace test is a strict expected failure below 2.13.
"""

from __future__ import annotations

import copy

import torch

from dpsbi.mechanisms import Laplace


def unpacked(m, epsilon):
    out = object.__new__(type(m))
    for key, value in {**vars(m), "epsilon": epsilon, "scale": m.sensitivity / epsilon}.items():
        setattr(out, key, value)
    return out


def items_loop(m, epsilon):
    out = object.__new__(type(m))
    for key, value in vars(m).items():
        setattr(out, key, value)
    out.epsilon, out.scale = epsilon, m.sensitivity / epsilon
    return out


def keys_getattr(m, epsilon):
    out = object.__new__(type(m))
    for key in m.__dict__:
        setattr(out, key, getattr(m, key))
    out.epsilon, out.scale = epsilon, m.sensitivity / epsilon
    return out


def dict_update(m, epsilon):
    out = object.__new__(type(m))
    out.__dict__.update(m.__dict__)
    out.epsilon, out.scale = epsilon, m.sensitivity / epsilon
    return out


def shallow_copy(m, epsilon):
    out = copy.copy(m)
    out.epsilon, out.scale = epsilon, m.sensitivity / epsilon
    return out


def main() -> None:
    print("torch", torch.__version__)
    mechanism = Laplace(1.0, sensitivity=0.5, dim=3)
    s = torch.zeros(4, 3)
    epsilon = torch.tensor([[0.5], [1.0], [2.0], [4.0]])
    for variant in (unpacked, items_loop, keys_getattr, dict_update, shallow_copy):

        def step(s, epsilon, variant=variant):
            at = variant(mechanism, epsilon)
            return s + at.scale * torch.ones_like(s)

        torch._dynamo.reset()
        try:
            out = torch.compile(step, fullgraph=True, backend="eager")(s, epsilon)
            assert torch.equal(out, step(s, epsilon))
            print(f"{variant.__name__}: traced")
        except Exception as error:  # noqa: BLE001 (a probe: every failure is the answer)
            print(f"{variant.__name__}: {type(error).__name__}: {str(error).splitlines()[0]}")


if __name__ == "__main__":
    main()
