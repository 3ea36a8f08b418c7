"""The envrun command line: :mod:`.main` builds the parser from one module per command group
(:mod:`.run`, :mod:`.cluster`, :mod:`.checkpoint`): parse, call one library function, print."""
