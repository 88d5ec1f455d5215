"""The studies: each a study.yaml (what runs) and, where it has one, its report.py (what it writes)."""
