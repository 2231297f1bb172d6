"""Shared fixtures: the forge's tiny model, built once and cached (see orchestrator.models)."""

import pytest


@pytest.fixture(scope="session")
def tiny_model():
    from orchestrator.models import forge

    return forge.default_model()

