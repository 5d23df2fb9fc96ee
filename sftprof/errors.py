"""The one base class of errors a user can act on (bad config, damaged trace, rejected job...):
the CLI prints their message in one line, without a traceback."""


class SftprofError(Exception):
    """An error whose message says what is wrong and what to do."""


def shown(value, limit: int = 80) -> str:
    """A value as an error message quotes it: its repr (escapes and all), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
