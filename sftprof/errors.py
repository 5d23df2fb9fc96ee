"""The one base class of errors a user can act on (bad config, damaged trace, rejected job...):
the CLI prints their message in one line, without a traceback."""


class SftprofError(Exception):
    """An error whose message says what is wrong and what to do."""
