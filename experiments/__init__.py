"""nanonorm experiments: what the command-line tools of scripts/ share, importable and tested: reading run
directories (runs.py), a paper table's cost (cost.py) and its layout (paper_tables.py)."""
