"""ml-dev-env guard rails: pure rules (`policy.rules`) and the Pulumi policy pack (`policy/__main__.py`)."""
