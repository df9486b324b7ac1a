"""Tests of the model-packaging step programs, run as their deployed script texts."""
