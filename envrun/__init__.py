"""envrun: run training jobs from locked images, with preflight checks such as the checkpoint audit."""
