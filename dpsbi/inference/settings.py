"""Frozen dataclasses of settings that travel as plain dicts (configs, checkpoints, posterior files)."""

from __future__ import annotations

from dataclasses import asdict, fields


class Settings:
    """Mixin for a frozen dataclass of settings: ``coerce`` builds it from an instance, a dict of its
    fields (unknown keys raise, naming them) or ``None`` (the defaults); ``to_dict`` goes back."""

    @classmethod
    def coerce(cls, value, defaults: dict | None = None):
        """``value`` as settings: an instance as it is; a dict or ``None`` applied over ``defaults`` (field
        values that differ from the class's own defaults)."""
        if isinstance(value, cls):
            return value
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"expected a {cls.__name__} or a dict of its fields, got {type(value).__name__}")
        value = {**(defaults or {}), **(value or {})}
        known = cls.field_names()
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"unknown {cls.label} settings {unknown}; known: {known}")
        return cls(**value)

    @classmethod
    def field_names(cls) -> list[str]:
        """The names of the settings, in their order."""
        return [f.name for f in fields(cls)]

    def to_dict(self) -> dict:
        return asdict(self)
