"""The ``aptix`` command: run the gateway, a worker, migrations and the demo."""

__all__: list[str] = []
