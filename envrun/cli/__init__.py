"""The envrun command line: :mod:`.main` and a module per command group (:mod:`.run`, :mod:`.cluster`, :mod:`.checkpoint`)."""
