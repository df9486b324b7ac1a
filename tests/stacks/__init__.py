"""Tests of stacks/ (one test module per source module)."""
