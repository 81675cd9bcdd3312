from tests.server.conftest import launch  # noqa: F401  (the same server factory fixture)
