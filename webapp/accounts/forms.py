"""Login forms that say so when logins are throttled (webapp.accounts.throttle), before the
password is tried."""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm


def throttled_message(wait_s: int) -> str:
    minutes = max(1, math.ceil(wait_s / 60))
    return (f"Too many failed logins for this username or from this address: try again in "
            f"{minutes} minute{'' if minutes == 1 else 's'}.")


class ThrottledLoginMixin:
    """For an AuthenticationForm: ``retry_after`` is the seconds to wait when refused. The
    refusal comes from authenticate() (webapp.accounts.backends), which counts the attempt
    before the password is tried."""

    retry_after = 0
    request: Any
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            self.retry_after = getattr(self.request, "login_retry_after", 0)
            if not self.retry_after:
                raise
            raise forms.ValidationError(throttled_message(self.retry_after),
                                        code="throttled") from None
        return cleaned


class LoginForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
