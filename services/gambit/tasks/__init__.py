"""Reasoning tasks: the synthetic arithmetic task, public benchmark loaders, answer checking."""
