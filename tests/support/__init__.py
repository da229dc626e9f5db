"""Operator tools and a mode catalog used by the integration tests."""
