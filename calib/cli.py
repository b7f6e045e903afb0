"""CLI for trtfuse.calib (filled in by its issue)."""


def register(sub) -> None:
    pass
