"""The lab's error types: every user-facing failure is one of these, printed as one line."""


class LabError(Exception):
    """A failure the user can act on; the CLI prints it as a single line and exits 2."""


class SpecError(LabError):
    """A fabric spec is malformed; the message names the field and the object."""


class EnvironmentProblem(LabError):
    """A missing privilege, binary or service; the message says what to run to fix it."""


class Terminated(LabError):
    """SIGTERM arrived during a run; raised so that teardown runs (exit code 130, as Ctrl-C)."""
