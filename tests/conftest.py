"""Shared pytest setup: the service fixtures (dockerd, registry, base image) and their CI rule."""

pytest_plugins = ["tests.services"]
