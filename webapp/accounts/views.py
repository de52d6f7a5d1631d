"""The login page (the dashboard's and the browsable API's): a login refused for too many
failures answers 429 with ``Retry-After``, and the form says why."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpResponse

from webapp.accounts.forms import LoginForm


class LoginView(auth_views.LoginView):
    authentication_form = LoginForm

    def form_invalid(self, form: LoginForm) -> HttpResponse:  # type: ignore[override]
        response = super().form_invalid(form)
        if form.retry_after:
            response.status_code = 429
            response["Retry-After"] = str(form.retry_after)
        return response
