"""quartet: low-precision (FP4 / FP8 / BF16) LLM pre-training experiments and their scaling laws."""

__version__ = "0.1.0"
