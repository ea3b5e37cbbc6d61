"""Boundary scorers (STEP's MLP probe and a history-aware sequence model) over the target's states."""

from gambit.scoring.auc import auc
from gambit.scoring.confidence_scorer import ConfidenceScorer
from gambit.scoring.config import ScorerConfig
from gambit.scoring.scorer import BoundaryScorer, load_scorer, random_scorer, save_scorer

__all__ = ["BoundaryScorer", "ConfidenceScorer", "ScorerConfig", "auc", "load_scorer", "random_scorer",
           "save_scorer"]
