"""The job probe: what the job would meet where it runs, found before anything is launched.

- :mod:`~envrun.probe.job_script`: the probe itself, a standalone script run with the job's interpreter
  (this host's, the image's in a container with no network and no devices, each Ray node's);
- :mod:`~envrun.probe.request`: what it is asked (the run plan carries one);
- :mod:`~envrun.probe.report`: its report as a typed value, and the preflight lines (pure);
- :mod:`~envrun.probe.run`: running it locally and in a container of the image (Ray nodes run it from
  :mod:`envrun.cluster.onnode`).
"""
