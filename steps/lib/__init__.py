"""Code the step programs share; each step imports the modules it needs (see steps/embed.py)."""
