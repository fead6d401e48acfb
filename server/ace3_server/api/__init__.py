"""The HTTP layer: dependencies, one router per resource, mounted under /v1."""
