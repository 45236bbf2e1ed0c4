"""GPU209: exceptions in the settings are removed or renewed when they expire.

Once an exception's `expires` has passed, the policies it named apply to its objects again; the
entry left in the settings file only misleads whoever reads it.
"""

from __future__ import annotations

import datetime

from policies import model, settings
from webhook.audit import findings
from webhook.audit.checks import base


class ExpiredException(base.ExceptionCheck):
    """Exceptions past their expiry."""

    id = "GPU209"
    rule = "expired-exception"
    summary = "exceptions in the settings are removed or renewed when they expire"
    severity = findings.Severity.LOW
    category = "GPU Configuration"
    action = model.Action.WARN

    def check_exception(self, exception: settings.PolicyException, *, now: datetime.datetime) -> findings.Finding | None:
        """A failure for an exception expired at `now`; None for one still in force (no pass result)."""
        if not exception.expired(now):
            return None
        subject = findings.ObjectRef(
            namespace="", kind="GpuAdmissionException", name=exception.name, api_version="gpu-admission.io/v1alpha1"
        )
        expired = exception.expires.isoformat() if exception.expires is not None else "?"
        return self.finding(
            subject,
            result=model.Result.FAIL,
            detail=f"exception {exception.name!r} for {', '.join(sorted(exception.policies))} expired {expired}",
        )
