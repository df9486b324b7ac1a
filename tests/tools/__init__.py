"""Tests of tools/ (render, docs generators, mock engine, oc runner, status, racks)."""
