"""Inference engines behind verl's rollout switch (``actor_rollout_ref.rollout.name``), by the import
paths of verl's docs: ``from verl.engine.rollout import vLLMRolloutEngine``."""
