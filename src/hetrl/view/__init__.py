"""The run viewer: ``python -m hetrl.view RUN`` (or ``python launch.py view RUN``) serves a run directory's
overview, metrics, rollouts and timeline to a browser, live while the run writes them (docs/viewer.md)."""
