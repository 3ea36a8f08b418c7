"""``envrun cluster``: a Ray cluster of containers of one locked image on several hosts, every node checked.

- :mod:`~envrun.cluster.spec`: the cluster file, read strictly;
- :mod:`~envrun.cluster.nodes`: a node's container and ``ray start`` line (pure);
- :mod:`~envrun.cluster.state`: where the state lives (container labels + a state file) and why;
- :mod:`~envrun.cluster.up`, :mod:`~envrun.cluster.manage`: ``up``, ``status`` and ``down``;
- :mod:`~envrun.cluster.nodecheck`: each node's own answer to "which lock do you run?", before a job.

Containers are reached only through :mod:`envbuild.engine.client`, Ray only through :mod:`envrun.ray_api`.
"""
