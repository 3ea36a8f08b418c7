"""The run as a scheduler starts it: one prepared plan, rendered for Slurm (run: ``--backend slurm``, or
written: ``--emit sbatch``) and for Kubernetes (written: ``--emit volcano|rayjob``).

What runs inside the job is the same for every scheduler (:mod:`envrun.injob`, shipped beside the job by
:mod:`.jobdir`); what differs is only how the nodes are started, here.
"""
