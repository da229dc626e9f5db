"""Support for the tests: operator tools, a mode catalog and LocalStack (the integration tests' processes)."""
