from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "webapp.accounts"
    label = "accounts"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from webapp.accounts import throttle

        # a failed login is counted before its password is tried (backends), a successful
        # one given back here
        user_logged_in.connect(throttle.on_logged_in, dispatch_uid="webapp.accounts.logged_in")
