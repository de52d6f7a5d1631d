from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.webapp.factories import UserFactory
from webapp.common.secrets import secret_digest
from webapp.devices.models import EnrollmentToken

pytestmark = pytest.mark.django_db


def test_create_enrollment_token_prints_a_working_token_and_the_agent_command():
    user = UserFactory(username="ops")
    out = StringIO()
    call_command("create_enrollment_token", "--uses", "3", "--label", "lab", "--user", "ops",
                 "--server", "http://edge:8000", stdout=out)
    token = EnrollmentToken.objects.get()
    secret = next(w for w in out.getvalue().split() if w.startswith("ept_"))
    assert token.token_digest == secret_digest(secret)
    assert (token.max_uses, token.label, token.created_by) == (3, "lab", user)
    assert f"python -m agent enrol --server http://edge:8000 --token {secret}" in out.getvalue()


def test_create_enrollment_token_quiet_prints_only_the_token():
    out = StringIO()
    call_command("create_enrollment_token", "--quiet", stdout=out)
    assert secret_digest(out.getvalue().strip()) == EnrollmentToken.objects.get().token_digest


def test_create_enrollment_token_rejects_an_unknown_user():
    with pytest.raises(CommandError, match="--user: no user named 'ghost'"):
        call_command("create_enrollment_token", "--user", "ghost", stdout=StringIO())
    assert not EnrollmentToken.objects.exists()


@pytest.mark.parametrize(("flag", "value"), [("--uses", "0"), ("--expires-in", "-5")])
def test_create_enrollment_token_rejects_a_count_below_one(flag, value):
    with pytest.raises(CommandError, match=f"{flag} must be at least 1, got {value}"):
        call_command("create_enrollment_token", flag, value, stdout=StringIO())
