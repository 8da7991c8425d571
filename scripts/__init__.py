"""Stage 11, maintenance scripts: `python scripts/<name>.py` (README results, parity fixtures,
demo studies). They import only installed packages; tests import them as `scripts.<name>`.
"""
