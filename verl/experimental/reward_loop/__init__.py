"""verl 0.8+'s reward loop, as far as code written for it imports it: ``reward_manager`` (the base class of a
reward-loop manager and its ``register`` decorator). The scoring itself runs in this repository's reward
workers (verl.workers.reward.verl_shapes)."""
