"""The OpenAI-compatible face of the gateway (``/openai/v1``): Responses and Conversations over turns and sessions.

Translation lives here, at the edge: an OpenAI request becomes a turn (``TurnRequest`` plus
``shared.openai.TurnExtras``), and a turn's round is rendered back as a ``Response``. Nothing below
the gateway knows which face a turn came from, except the webhook outbox's choice of event shape.
"""
