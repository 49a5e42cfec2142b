"""The errors a user can cause, and the exit code the ``verl`` command gives each.

Anything derived from :class:`UserError` is the user's to fix (a config value, a data file, a model
directory, a run directory in use): the command prints its message on one line and exits with its
``exit_code``, without a Python traceback (``--debug`` or ``VERL_DEBUG=1`` shows one). Any other
exception is a bug in verl or a library, and keeps its traceback.

Exit codes of ``verl run`` / ``verl sft`` / ``verl export``:

====  ==========================================================================
0     success
1     the run failed while training (a worker, the reward function, a step)
2     config error: unknown key, wrong type, value out of range (:class:`verl.config.ConfigError`)
3     input error: a data file, dataset row, model or checkpoint path (:class:`InputError`)
4     run directory error: in use by another run, holds another run, or a resume that would
      change the run's meaning (:class:`RunDirError`)
5     storage error: a checkpoint could not be written (a full disk, a read-only or failing file
      system); the unfinished checkpoint is removed, the previous one is intact (:class:`StorageError`)
6     cluster error: the Ray cluster cannot hold the workers asked for (too few nodes or resources
      for ``trainer.nnodes``) (:class:`ClusterError`)
7     package error: a package the run needs is not installed, older than verl requires, or built
      for another version of one it needs (:class:`PackageError`; ``verl doctor`` shows them all)
130   interrupted (Ctrl-C / SIGINT); the last complete checkpoint is intact
143   terminated (SIGTERM); the same
====  ==========================================================================
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with what the user gave; the message says what and where, and how to fix it."""

    exit_code = 1
    label = "error"
    """how ``verl`` starts the line it prints for it"""


class InputError(UserError, ValueError):
    """A data file, dataset row, model directory or checkpoint the user named is missing or malformed."""

    exit_code = 3
    label = "input error"


class RunDirError(UserError):
    """The run directory is locked by another run, holds another run's files, or would be misused."""

    exit_code = 4
    label = "run directory error"


class StorageError(UserError):
    """Writing the run's files failed in the file system (no space, read-only, I/O error)."""

    exit_code = 5
    label = "storage error"


class ClusterError(UserError):
    """The Ray cluster cannot place the workers asked for: too few alive nodes, or too few resources on them."""

    exit_code = 6
    label = "cluster error"


class PackageError(UserError):
    """A package the run needs is not installed, is older than verl requires, or clashes with another
    installed package (:func:`verl.doctor.packages.check_packages`)."""

    exit_code = 7
    label = "package error"


def describe_error(error: BaseException) -> str:
    """``TypeName: first line of the message``: an error from a library or a worker, in one line."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
