"""The error a data source raises when it cannot be loaded as asked (its message says how to fix it)."""


class DataSourceError(ValueError):
    """A data source that cannot be loaded as asked; the message says how to fix it."""
