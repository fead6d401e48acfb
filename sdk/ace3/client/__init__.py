"""The HTTP client: :class:`Client` and its resources (``client.models``, ``client.datasets``,
``client.jobs``, ``client.searches``, ``client.checkpoints``, ``client.workers``), the resource
types they return, and the cursor pages of list calls. Retries, the user agent and the event
stream reader are internal (``_http``, ``_sse``); nothing here imports torch.
"""

from ace3.client._client import (
    Client,
    DatasetRef,
    ModelRef,
    get_default_client,
    set_default_client,
)

__all__ = ["Client", "DatasetRef", "ModelRef", "get_default_client", "set_default_client"]
