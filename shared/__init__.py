"""Contracts both sides of Aptix speak: settings, wire models, results, persistence, state.

Nothing in this package imports ``workers`` or ``api_gateway``.
"""

__all__: list[str] = []
