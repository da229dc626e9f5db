"""The pipeline steps, one module each, named as in ARCHITECTURE.md.

Every module has one public ``run(ctx, env, state) -> InvokeResult[Next]``: plain Python, no
Celery, no global settings; the driver loads and saves the state around it.
"""

__all__: list[str] = []
