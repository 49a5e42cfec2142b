"""``verl doctor``: will a config run on this machine, and if not, why?

Before a run starts it reports the installed versions against the tested support matrix (and clashes between
them: vLLM's torch pin, torchvision built for another torch), the machine (CPU features, cores, memory, GPUs,
disk), the batch arithmetic of the config explained key by key, and a peak-memory estimate per role compared
with what the machine has. See docs/doctor.md.

The command is :func:`verl.doctor.cli.cmd_doctor` (registered by :func:`verl.doctor.cli.add_parser`); the
diagnosis itself is :func:`verl.doctor.report.diagnose`. Nothing heavy is imported here.
"""
