"""Benchmarks of verl, kept out of the library package: ``benchmarks.harness`` is what ``verl bench`` runs
(from a source checkout); the other modules here are standalone scripts."""
