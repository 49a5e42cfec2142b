"""Overrides that keep every trained role in fp32: unset, strategy dp computes in bf16 on a CPU with bf16
instructions (verl.utils.precision), so tests that compare two code paths token for token pin fp32."""

FP32_SECTIONS = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")
FP32 = tuple(f"{section}.fsdp_config.mixed_precision.param_dtype=fp32" for section in FP32_SECTIONS)
