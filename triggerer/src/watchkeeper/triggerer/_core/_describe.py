"""How the runtime names an error in statuses and logs, and finds a lost lease behind one."""

from __future__ import annotations

from watchkeeper.store import LeaseLostError
from watchkeeper.store.protocols import redact_secrets

__all__ = ["describe_error", "lease_lost"]


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"``, the form errors take in statuses and logs.

    A URL's password in the message is masked: the text is shown by ``watchkeeper status``.
    """
    text = redact_secrets(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def lease_lost(error: BaseException | None) -> LeaseLostError | None:
    """The :class:`LeaseLostError` behind ``error`` (itself, or one it was raised from)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, LeaseLostError):
            return error
        error = error.__cause__ or error.__context__
        seen += 1
    return None
