"""Logging in: failed logins are throttled per username and per client address
(:mod:`webapp.accounts.throttle`) on the dashboard's login form, the browsable API's and the
admin's, and for any other ``authenticate()``
(:class:`~webapp.accounts.backends.LoginThrottleBackend`)."""
