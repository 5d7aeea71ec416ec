"""Exception families raised by envhub; each message names the problem and the fix."""

from __future__ import annotations


class EnvhubError(Exception):
    """Base class of every error envhub raises on purpose."""

    hint: str = ""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        return f"{message} ({self.hint})" if self.hint else message


class EnvNotFound(EnvhubError, KeyError):
    """An environment id that is not registered."""

    __str__ = EnvhubError.__str__  # KeyError's own would quote the message


class EnvUnavailable(EnvhubError):
    """A registered env this machine cannot run (a missing runtime, data it would download, a broken package)."""


class RegistrationError(EnvhubError):
    """A register() call with bad arguments, or a broken plugin."""


class ResetNeeded(EnvhubError):
    """step() called before reset() or after the episode ended."""


class ConfigError(EnvhubError):
    """A configuration file or value that cannot be used."""


class SandboxError(EnvhubError):
    """A sandbox that cannot be created, reached or used."""


class EngineError(EnvhubError):
    """An inference engine that cannot be started or reached."""


class EngineUnreachable(EngineError):
    """An inference engine that did not answer at all (connection refused or dropped, a timeout): an outage,
    never the request's own fault, even when the engine answers again by the time anyone looks."""


class HarnessError(EnvhubError):
    """A harness episode that cannot be set up (an empty command, an env it cannot play, a bad runner)."""
