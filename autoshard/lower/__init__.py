"""Lowerings of a solved Plan: schedule text (Slapo style) and export formats."""
