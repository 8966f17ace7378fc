"""Base62, the encoding of VPC and attachment identifiers (SPEC §4), and their limits."""

from __future__ import annotations

BASE62_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_BASE62_INDEX = {ch: i for i, ch in enumerate(BASE62_ALPHABET)}
VPC_LIMIT = 2**48
ATTACHMENT_LIMIT = 2**16


def decode_base62(text: str) -> int:
    """Value of a base62 string (digits, then lowercase, then uppercase); ValueError if invalid."""
    if not text:
        raise ValueError("empty base62 string")
    value = 0
    for ch in text:
        digit = _BASE62_INDEX.get(ch)
        if digit is None:
            raise ValueError(f"invalid base62 character {ch!r} in {text!r}")
        value = value * 62 + digit
    return value


def encode_base62(value: int) -> str:
    """Shortest base62 string of a non-negative integer."""
    if value < 0:
        raise ValueError(f"cannot encode negative value {value}")
    digits = []
    while True:
        value, digit = divmod(value, 62)
        digits.append(BASE62_ALPHABET[digit])
        if value == 0:
            return "".join(reversed(digits))
