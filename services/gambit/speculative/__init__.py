"""Speculative decoding: the EAGLE-3.1 drafter, tree drafting with Parallel Reconsideration, verification."""

from gambit.speculative.drafter import Drafter, DrafterConfig, load_drafter, random_drafter, save_drafter

__all__ = ["Drafter", "DrafterConfig", "load_drafter", "random_drafter", "save_drafter"]
