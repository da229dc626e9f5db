"""HTTP routes, one module per resource."""

__all__: list[str] = []
