"""The HTTP gateway: auth, validation, id assignment, enqueue, reads, health and metrics."""
