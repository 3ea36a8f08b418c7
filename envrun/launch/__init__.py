"""Launchers: run a :class:`~envrun.plan.RunPlan` on one backend, stream its output, stop it on Ctrl-C.

Each backend is one module and the only place that talks to its engine (a subprocess, Ray's job
API, dockerd); the engines' packages are imported only when that backend is used. What a launcher is
lives in :mod:`.base`, which the backends import (and the Slurm one, :mod:`envrun.schedule.slurm`);
choosing one is the run's (:func:`envrun.prepare.launcher_for`), above every backend.
"""
