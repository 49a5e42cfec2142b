"""verl: HybridFlow reinforcement-learning post-training for language models."""

__version__ = "0.1.0"
