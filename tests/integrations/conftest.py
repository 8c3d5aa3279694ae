"""Fixtures for the NebulaGraph integration tests (see mploader.testing.pytest_nebula).

``nebula_server`` is session-scoped: one test graphd subprocess (or the real NebulaGraph named by
``NEBULA_ADDR``) serves every test here.  Other test folders can reuse it the same way.
"""

from mploader.testing.pytest_nebula import nebula_admin, nebula_server  # noqa: F401
