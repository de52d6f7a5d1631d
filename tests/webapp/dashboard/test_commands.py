from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_create_demo_admin_prints_a_password_that_logs_in():
    out = StringIO()
    call_command("create_demo_admin", stdout=out)
    words = out.getvalue().split()
    password = words[words.index("password") + 1]
    user = authenticate(username="admin", password=password)
    assert user is not None and user.is_superuser and user.is_staff


def test_create_demo_admin_again_gives_a_new_password():
    first, second = StringIO(), StringIO()
    call_command("create_demo_admin", "--username", "demo", stdout=first)
    call_command("create_demo_admin", "--username", "demo", stdout=second)
    old = first.getvalue().split()[-1]
    new = second.getvalue().split()[-1]
    assert "updated" in second.getvalue() and old != new
    assert authenticate(username="demo", password=old) is None
    assert authenticate(username="demo", password=new) is not None
