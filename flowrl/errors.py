"""User-facing errors: the CLI prints their message (no traceback) and exits with status 2."""


class UserError(Exception):
    """Bad input from the user: a config field, a file, a flag. The message names it and says what was expected."""


class ConfigError(UserError):
    pass
