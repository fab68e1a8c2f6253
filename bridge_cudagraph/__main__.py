"""``python -m bridge_cudagraph``: the same CLI as the ``bridge-cudagraph`` script."""

import sys

from bridge_cudagraph.cli import main

sys.exit(main())
