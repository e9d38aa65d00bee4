"""Scaling-law analysis of logged losses. Importable without torch."""
