"""verl's ``verl.experimental`` import paths, for code written against verl (see each subpackage)."""
