"""Tests of core/ (one test module per source module)."""
