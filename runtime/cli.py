"""CLI for trtfuse.runtime (filled in by its issue)."""


def register(sub) -> None:
    pass
