"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class TrtfuseError(Exception):
    """A problem with the user's input or environment, stated in one line.

    Library code raises this (never a bare ValueError) for anything a user can fix: a malformed
    model, an unsupported option, a missing optional dependency. The CLI prints
    `trtfuse: error: <message>` and exits with status 2, without a traceback.
    """


def require(condition: bool, message: str) -> None:
    if not condition:
        raise TrtfuseError(message)
