"""Benchmarks of verl: standalone scripts. What they share with ``verl bench`` (the harness that measures a
case in its own process, the bench models, the step runner) is the library's :mod:`verl.bench`."""
