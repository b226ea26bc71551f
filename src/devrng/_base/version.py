"""devrng's version: the one place it is written (pyproject.toml reads it, ``devrng
--version`` prints it, and saved states record it)."""

VERSION = "0.4.0"
