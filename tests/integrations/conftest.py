"""Fixtures for the NebulaGraph integration tests (see tests.integrations.nebula_fixtures).

``nebula_server`` is session-scoped: one test graphd subprocess (or the real NebulaGraph named by
``NEBULA_ADDR``) serves every test here.  Other test folders can reuse it the same way.
"""

from tests.integrations.nebula_fixtures import nebula_admin, nebula_server  # noqa: F401
