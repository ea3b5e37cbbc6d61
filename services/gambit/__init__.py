"""Gambit: reasoning serving with thought-level beam search and Parallel Reconsideration."""
