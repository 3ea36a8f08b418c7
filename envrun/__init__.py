"""envrun: run training jobs from locked images, with preflight checks such as the checkpoint audit."""


def first_line(exc: BaseException) -> str:
    """An exception's message for a one-line report: its first line, else the exception's type."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
