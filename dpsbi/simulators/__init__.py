"""Epidemic simulators: exact Gillespie SIR (numba) and batched tau-leaping SIR (torch)."""

from .sir import DEFAULT_TIMES, gillespie_sir, simulate_sir, tau_leap_sir

__all__ = ["DEFAULT_TIMES", "gillespie_sir", "simulate_sir", "tau_leap_sir"]
