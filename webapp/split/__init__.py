"""Parallel split learning in the web app: studies of one split-learning instance solved by
several methods of :mod:`orchestrator.sl` on Celery workers, compared side by side."""
