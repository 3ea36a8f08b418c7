import sys

from envrun.injob.node import main

sys.exit(main(sys.argv[1:]))
