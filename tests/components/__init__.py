"""Tests of components/ (one test module per source module)."""
