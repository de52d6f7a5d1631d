"""Settings per situation: ``local`` (a laptop, the default of manage.py), ``test`` (pytest),
``production`` (docker-compose, several machines). All read the environment (.env.example)."""
