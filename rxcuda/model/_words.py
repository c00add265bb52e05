"""Words in messages: a number and its noun, singular or plural ("1 parameter", "2 parameters")."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural (``plural``, else ``noun + "s"``) unless ``n`` is 1.

    >>> counted(1, "rebuild"), counted(3, "rebuild"), counted(0, "check"), counted(1, "graph node")
    ('1 rebuild', '3 rebuilds', '0 checks', '1 graph node')
    >>> counted(2, "memory", "memories")
    '2 memories'
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
