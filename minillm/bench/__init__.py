"""Measuring every claim of the lessons on this machine (`python -m minillm bench`), and the report."""
