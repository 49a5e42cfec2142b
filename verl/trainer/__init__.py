"""Trainers: the RL loop and the supervised warm start."""
