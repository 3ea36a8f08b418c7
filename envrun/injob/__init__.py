"""The run as a scheduler starts it: the programs that run inside the locked image on every node of a
Slurm allocation or a Kubernetes job, from the code envrun ships beside the job (:mod:`envrun.schedule`).

- ``node`` (:mod:`.node`), on every node: this node's own check (the lock its image carries, the NPUs it
  sees), then Ray: the head starts it and runs the driver, every other node joins the head and blocks;
- ``check``: the node's own check alone (a Kubernetes init container, before the node starts);
- the driver (:mod:`.driver`), on the head once every node has joined: the run envrun prepared on the
  submitting host, executed as the Ray backend executes it — every node checked (lock, NPUs, model,
  data, the job probe, network, storage), the trainer, the export audit — recorded in the job's run
  directory, its exit status the job's.

They run with the image's ``python3``: only the standard library, Ray's own dependencies (``yaml``,
``packaging``) and envrun itself are imported.
"""
