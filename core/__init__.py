"""Pure domain code: names, quantities, NCCL settings, sizing rules, presets and the dev-server table.

The bottom layer: it imports nothing of ours (no `stacks`, `components`, Pulumi or pulumi_kubernetes), so
`core → stacks → components → __main__` (tests/repo/test_layers.py walks the imports and enforces it).
"""
