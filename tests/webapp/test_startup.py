"""What a web process pays to start: the ASGI application and the URLs load without torch
(the replica API imports it on its first replica). It cost every daphne process of the demo
and of a deployment more than a second of CPU and a couple of hundred MB before serving."""

import subprocess
import sys

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env


def test_the_web_application_starts_without_importing_torch():
    code = ("import django; django.setup(); import webapp.asgi, webapp.urls, sys; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**child_env(), "DJANGO_SETTINGS_MODULE": "webapp.settings.local"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"
