"""CLI for trtfuse.graph_passes (filled in by its issue)."""


def register(sub) -> None:
    pass
